#!/usr/bin/env bash
# End-to-end check of the Docker deployment: build the images, bring the compose stack up on loopback,
# run 2 rounds of the water app over 3 SuperNodes (each ClientApp container mounting only its household's
# file), check the results, tear everything down.
#
#   bash scripts/docker_e2e.sh            # BASE=official (default) pulls flwr/* images
#   BASE=standin bash scripts/docker_e2e.sh   # no registry: a Debian rootfs (debootstrap) + flwr, built here
#   TLS=1 BASE=standin bash scripts/docker_e2e.sh   # with docker/compose.tls.yml: TLS + SuperNode auth
#
# Starts dockerd if none is running and stops what it started (by PID). Network traffic stays on 127.0.0.1
# (the compose file's host networking, every service bound to 127.0.0.1 on free ports set through its
# documented environment variables). Needs: docker (engine + compose), and for BASE=standin
# debootstrap and root. Writes to .docker-e2e/ (ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=$ROOT/.docker-e2e
BASE=${BASE:-official}
mkdir -p "$WORK"
started=$(date +%s)
log() { echo "[docker-e2e $(( $(date +%s) - started ))s] $*"; }

DOCKERD_PID=""
cleanup() {
  rc=$?
  if [ -n "${COMPOSE:-}" ]; then $COMPOSE down --remove-orphans >"$WORK/down.log" 2>&1 || true; fi
  if [ -n "$DOCKERD_PID" ]; then log "stopping the dockerd we started (pid $DOCKERD_PID)"; kill "$DOCKERD_PID" || true; wait "$DOCKERD_PID" 2>/dev/null || true; fi
  exit $rc
}
trap cleanup EXIT INT TERM

if ! docker info >/dev/null 2>&1; then
  log "no Docker engine running: starting dockerd"
  dockerd >"$WORK/dockerd.log" 2>&1 &
  DOCKERD_PID=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { log "dockerd did not start; see $WORK/dockerd.log"; exit 1; }
fi
if docker compose version >/dev/null 2>&1; then COMPOSE_BIN="docker compose"; else COMPOSE_BIN="docker-compose"; fi

PY=${PYTHON:-$ROOT/.venv/bin/python}
# This machine's pip trusts a CA bundle that containers do not have (an HTTPS proxy): hand it to the builds.
host_cert=${PIP_CERT:-$("$PY" -m pip config get global.cert 2>/dev/null || true)}
if [ -n "$host_cert" ] && [ -f "$host_cert" ]; then
  cp "$host_cert" docker/extra-ca/ca-bundle.crt
  export PIP_CERT=/tmp/extra-ca/ca-bundle.crt
fi
export BOUQUET_IMAGE=bouquet-fl/superexec:e2e BOUQUET_BUILD_NETWORK=host
if [ "$BASE" = standin ]; then
  if ! docker image inspect bouquet/standin-flwr:1.42.0 >/dev/null 2>&1; then
    if ! docker image inspect bouquet/debian-rootfs:bookworm >/dev/null 2>&1; then
      log "building a Debian bookworm rootfs with debootstrap (a few minutes, once)"
      rm -rf "$WORK/rootfs"
      debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
        bookworm "$WORK/rootfs" http://deb.debian.org/debian >"$WORK/debootstrap.log" 2>&1
      tar -C "$WORK/rootfs" -c . | docker import - bouquet/debian-rootfs:bookworm >/dev/null
      rm -rf "$WORK/rootfs"
    fi
    log "building the stand-in flwr base image"
    docker build --network host ${PIP_CERT:+--build-arg PIP_CERT=$PIP_CERT} -t bouquet/standin-flwr:1.42.0 \
      -f docker/standin.Dockerfile docker >"$WORK/standin.log" 2>&1 || { tail -20 "$WORK/standin.log"; exit 1; }
  fi
  export FLWR_SUPERLINK_IMAGE=bouquet/standin-flwr:1.42.0 FLWR_SUPERNODE_IMAGE=bouquet/standin-flwr:1.42.0
  export BOUQUET_BASE_IMAGE=bouquet/standin-flwr:1.42.0
  # the CPU torch wheel pip uses on this machine, copied into the build context (docker/wheels, ignored by git)
  wheel=$(ls /opt/wheels/torch-*+cpu-*.whl 2>/dev/null | head -1 || true)
  if [ -n "$wheel" ]; then
    cp -u "$wheel" docker/wheels/
    version=$(basename "$wheel" | cut -d- -f2)   # e.g. 2.13.0+cpu: only the local wheel has that version
    export TORCH_PIP_ARGS="--find-links /tmp/wheels" TORCH_SPEC="torch==$version"
  fi
  export TORCH_PIP_ARGS=${TORCH_PIP_ARGS:---index-url https://download.pytorch.org/whl/cpu}
fi

# loopback ports for every service
free_port() { "$PY" -c "from bouquet.launch import free_port; print(free_port())"; }
export SUPERLINK_PORT=$(free_port) SUPERLINK_BIND=127.0.0.1 NODE_BIND=127.0.0.1
export SUPERLINK_ADDRESS=127.0.0.1:$SUPERLINK_PORT
for k in 0 1 2; do p=$(free_port); export NODE_${k}_PORT=$p NODE_${k}_ADDRESS=127.0.0.1:$p; done
export HOUSEHOLDS=$WORK/households BOUQUET_RESULTS=$WORK/results
rm -rf "$HOUSEHOLDS" "$BOUQUET_RESULTS"; mkdir -p "$BOUQUET_RESULTS"
daiad=../shared/data/daiad/swm_trialA.zip
if [ -f "$daiad" ]; then extra=(--daiad "$daiad"); else extra=(); fi
"$PY" -m bouquet.deploy --households-only "$HOUSEHOLDS" --nodes 3 "${extra[@]}" >/dev/null
log "one household file per node in $HOUSEHOLDS (${extra[*]:-synthetic})"

COMPOSE="$COMPOSE_BIN -p bouquet-e2e -f docker-compose.yml"
export FLWR_HOME=$WORK/flwr-home FLWR_TELEMETRY_ENABLED=0
rm -rf "$FLWR_HOME"; mkdir -p "$FLWR_HOME"
FLWR="$(dirname "$PY")/flwr"
if [ "${TLS:-0}" = 1 ]; then
  export CREDENTIALS=$WORK/credentials
  rm -rf "$CREDENTIALS"
  "$PY" -m bouquet.deploy --credentials-only "$CREDENTIALS" --nodes 3 --address 127.0.0.1 >/dev/null
  COMPOSE="$COMPOSE -f docker/compose.tls.yml"
  connection="root-certificates = \"$CREDENTIALS/certificates/ca.crt\""
else
  connection="insecure = true"
fi
printf '[superlink]\ndefault = "bouquet-docker"\n\n[superlink.bouquet-docker]\naddress = "%s"\n%s\n' \
  "$SUPERLINK_ADDRESS" "$connection" >"$FLWR_HOME/config.toml"
log "building the bouquet app image ($BASE base)"
$COMPOSE build >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
if [ "${TLS:-0}" = 1 ]; then
  log "TLS: starting the SuperLink, registering the three node keys"
  $COMPOSE up -d superlink >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; exit 1; }
  for _ in $(seq 60); do "$FLWR" supernode list bouquet-docker >/dev/null 2>&1 && break; sleep 1; done
  for k in 0 1 2; do "$FLWR" supernode register "$CREDENTIALS/keys/node$k.pub" bouquet-docker >>"$WORK/up.log" 2>&1; done
fi
log "starting the stack"
$COMPOSE up -d >>"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; exit 1; }
for _ in $(seq 120); do
  online=$("$FLWR" supernode list bouquet-docker --format json 2>/dev/null | grep -o '"online"' | wc -l || true)
  [ "$online" -ge 3 ] && break; sleep 1
done
log "$online SuperNodes online"
[ "$online" -ge 3 ] || { $COMPOSE logs --tail 40; exit 1; }

log "flwr run: 2 rounds, 3 households"
"$FLWR" run . bouquet-docker --stream --run-config \
  'data-source="daiad" min-history-days=300 num-server-rounds=2 clients-per-round=3 local-epochs=1 results-dir="/results" run-name="docker-e2e"' \
  >"$WORK/run.log" 2>&1 || { tail -40 "$WORK/run.log"; $COMPOSE logs --tail 40 >"$WORK/compose.log" 2>&1; exit 1; }
summary=$BOUQUET_RESULTS/docker-e2e/summary.json
for _ in $(seq 60); do [ -f "$summary" ] && break; sleep 1; done
"$PY" - "$summary" <<'PYCHECK'
import json, sys
summary = json.load(open(sys.argv[1]))
assert summary["rounds"] == 2 and summary["clients-evaluated"] == 3, summary
print(f"docker e2e OK: 2 rounds, 3 households, MAE {summary['mae-litres-mean']:.1f} L/day")
PYCHECK
docker stats --no-stream --format '{{.Name}} {{.MemUsage}}' >"$WORK/memory.txt" 2>/dev/null || true
log "passed; container memory at the end in $WORK/memory.txt"
