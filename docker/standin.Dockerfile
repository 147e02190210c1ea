# A local stand-in for the official flwr/* images, for machines that cannot pull from image registries
# (scripts/docker_e2e.sh builds it on a Debian rootfs made with debootstrap + `docker import`).
# Official images: use them instead (docker-compose.yml defaults to flwr/superlink, flwr/supernode,
# flwr/superexec 1.42.0).
ARG ROOTFS_IMAGE=bouquet/debian-rootfs:bookworm
FROM ${ROOTFS_IMAGE}
ENV PATH=/python/venv/bin:$PATH PYTHONUNBUFFERED=1
# PIP_CERT: a CA bundle in docker/extra-ca/ for networks whose HTTPS proxy re-signs certificates (optional)
ARG PIP_CERT=""
COPY extra-ca/ /tmp/extra-ca/
RUN if [ -z "$PIP_CERT" ]; then unset PIP_CERT; fi \
    && python3 -m venv /python/venv && /python/venv/bin/python -m pip install --no-cache-dir "flwr==1.42.0"
WORKDIR /app
