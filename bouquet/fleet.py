"""Compose files for a fleet of household boxes: one SuperLink, its ServerApp, and N SuperNode + ClientApp pairs.

    python -m bouquet.fleet --nodes 20 --out fleet/compose.yml                # 20 households, insecure, loopback
    python -m bouquet.fleet --nodes 20 --tls --out fleet/compose.yml          # TLS + SuperNode auth in the file
    python -m bouquet.fleet --nodes 1 --node-platform linux/arm64 \\
        --node-image flwr/supernode:1.42.0 --node-app-image my/bouquet:arm64 --out arm/compose.yml
    python -m bouquet.fleet --nodes 3 --node-layout single --node-cpus 1 --node-memory 512m --out pi/compose.yml

``docker-compose.yml`` (3 households, written by hand with YAML anchors) and ``docker/compose.tls.yml`` are
this generator's output for ``nodes=3`` (``tests/test_fleet.py`` loads both and compares them), so a fleet
file differs from the documented stack only in what its options ask for. Every service uses the host's
network and binds to 127.0.0.1 unless the same environment variables as ``docker-compose.yml`` say otherwise
(``SUPERLINK_BIND``, ``SUPERLINK_ADDRESS``, ``NODE_BIND``, ``NODE_<K>_PORT``, ``NODE_<K>_ADDRESS``,
``HOUSEHOLDS``, ``CREDENTIALS``, ``BOUQUET_RESULTS``; docs/DEPLOY.md). Node K's ClientApp port defaults to
9094 + K. No Flower import: the file is plain data, written with PyYAML.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

__all__ = ["FleetParams", "fleet_compose", "fleet_services", "main"]

_MEMORY = re.compile(r"^[1-9][0-9]*[bkmg]$")
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLATFORMS = ("linux/amd64", "linux/arm64")
_LAYOUTS = ("pair", "single")
FIRST_NODE_PORT = 9094


@dataclass(frozen=True)
class FleetParams:
    """What a generated compose file holds.

    Parameters
    ----------
    nodes : int
        Households, each a SuperNode service ``supernode-K`` and a ClientApp SuperExec ``clientapp-K``
        (K = 0 .. nodes - 1), node K reading ``${HOUSEHOLDS}/node-K.csv`` (``python -m bouquet.deploy
        --households-only``).
    tls : bool
        TLS on the SuperLink's port and SuperNode authentication, written into the file (what
        ``docker/compose.tls.yml`` adds to ``docker-compose.yml``); keys from ``python -m bouquet.deploy
        --credentials-only``.
    node_platform : str or None
        ``"linux/arm64"`` or ``"linux/amd64"`` for the households' containers (``None``: the host's). The
        SuperLink and ServerApp keep the host's.
    node_image : str or None
        Image of the SuperNodes; ``None``: ``${FLWR_SUPERNODE_IMAGE:-flwr/supernode:1.42.0}`` as in
        ``docker-compose.yml``.
    node_app_image : str or None
        Image of the ClientApp SuperExecs, which must already exist (no build section); ``None``: the
        bouquet app image of the ServerApp, built from ``docker/Dockerfile``.
    node_cpus : float or None
        ``cpus`` limit of each household container (a box's cores), ``None`` for none.
    node_memory : str or None
        Memory limit of each household container, e.g. ``"512m"`` or ``"1g"`` (swap included, so the limit
        is real), ``None`` for none.
    restart : str
        Restart policy of every service (``"on-failure"``, ``"unless-stopped"``, ``"always"`` or ``"no"``).
    node_layout : str
        ``"pair"`` (as ``docker-compose.yml``): a SuperNode container (Flower's image) and a ClientApp
        SuperExec container (the bouquet image) per household, Flower's ``process`` isolation. ``"single"``:
        one container per household, the bouquet image running ``flower-supernode --isolation subprocess``,
        so the ClientApp is a child of the SuperNode; one Python process fewer (about 110 MiB), and a memory
        limit covers the whole box (docs/DEPLOY.md, "A Pi-sized budget"). ``node_image`` does not apply.
    node_environment : tuple of (str, str)
        Environment variables of every household container, e.g. ``(("OMP_NUM_THREADS", "1"),)``.
    """

    nodes: int = 3
    tls: bool = False
    node_platform: str | None = None
    node_image: str | None = None
    node_app_image: str | None = None
    node_cpus: float | None = None
    node_memory: str | None = None
    restart: str = "on-failure"
    node_layout: str = "pair"
    node_environment: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, int) or isinstance(self.nodes, bool) or not 1 <= self.nodes <= 900:
            raise ValueError(f"nodes must be an integer in [1, 900] (node ports 9094 + K), got {self.nodes!r}")
        if self.node_platform is not None and self.node_platform not in _PLATFORMS:
            raise ValueError(f"node_platform must be one of {_PLATFORMS} or None, got {self.node_platform!r}")
        for name in ("node_image", "node_app_image"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip() or " " in value):
                raise ValueError(f"{name} must be an image reference such as 'flwr/supernode:1.42.0', got {value!r}")
        if self.node_cpus is not None and not (isinstance(self.node_cpus, (int, float)) and self.node_cpus > 0):
            raise ValueError(f"node_cpus must be a positive number of cores, got {self.node_cpus!r}")
        if self.node_memory is not None and not (isinstance(self.node_memory, str)
                                                 and _MEMORY.match(self.node_memory.lower())):
            raise ValueError(f"node_memory must be a size such as '512m' or '1g', got {self.node_memory!r}")
        if self.restart not in ("on-failure", "unless-stopped", "always", "no"):
            raise ValueError(f"restart must be on-failure, unless-stopped, always or no, got {self.restart!r}")
        if self.node_layout not in _LAYOUTS:
            raise ValueError(f"node_layout must be 'pair' or 'single', got {self.node_layout!r}")
        for pair in self.node_environment:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], str)
                    and isinstance(pair[0], str) and _VARIABLE.match(pair[0])):
                raise ValueError(f"node_environment must hold (NAME, value) pairs of strings, got {pair!r}")
        if self.node_layout == "single" and self.node_image is not None:
            raise ValueError("node_image names the SuperNode image of the 'pair' layout; with node_layout "
                             "'single' the household runs in node_app_image (or the built bouquet image)")


def _app_build() -> dict:
    return {"context": ".", "dockerfile": "docker/Dockerfile", "network": "${BOUQUET_BUILD_NETWORK:-default}",
            "args": {"BASE_IMAGE": "${BOUQUET_BASE_IMAGE:-flwr/superexec:1.42.0}",
                     "TORCH_PIP_ARGS": "${TORCH_PIP_ARGS:---index-url https://download.pytorch.org/whl/cpu}",
                     "TORCH_SPEC": "${TORCH_SPEC:-torch>=2.4}", "PIP_CERT": "${PIP_CERT:-}"}}


def fleet_services(params: FleetParams) -> dict[str, dict]:
    """The compose ``services`` mapping of ``params`` (see ``fleet_compose`` for the whole file)."""
    superlink_address = "${SUPERLINK_ADDRESS:-127.0.0.1:8000}"
    ca = "${CREDENTIALS:-./deploy}/certificates/ca.crt"
    app_image = "${BOUQUET_IMAGE:-bouquet-fl/superexec:0.1.0}"
    restart = {"restart": params.restart}
    if params.tls:
        link_security = ["--ssl-ca-certfile", "/certs/ca.crt", "--ssl-certfile", "/certs/server.pem",
                         "--ssl-keyfile", "/certs/server.key", "--enable-supernode-auth"]
        client_security = ["--root-certificates", "/certs/ca.crt"]
    else:
        link_security = client_security = ["--insecure"]
    services: dict[str, dict] = {"superlink": {
        "network_mode": "host", "image": "${FLWR_SUPERLINK_IMAGE:-flwr/superlink:1.42.0}",
        "entrypoint": ["flower-superlink"],
        "command": link_security + ["--isolation", "process", "--host", "${SUPERLINK_BIND:-127.0.0.1}",
                                    "--port", "${SUPERLINK_PORT:-8000}", "--database", "/tmp/state.db",
                                    "--disable-runtime-dependency-installation"]}}
    if params.tls:
        services["superlink"]["volumes"] = ["${CREDENTIALS:-./deploy}/certificates:/certs:ro"]
    services["serverapp"] = {"network_mode": "host", "image": app_image, "build": _app_build(), **restart,
                             "command": client_security + ["--runtime-api-address", superlink_address],
                             "depends_on": ["superlink"], "volumes": ["${BOUQUET_RESULTS:-./results}:/results"]
                             + ([f"{ca}:/certs/ca.crt:ro"] if params.tls else [])}
    limits: dict = {}
    if params.node_platform is not None:
        limits["platform"] = params.node_platform
    if params.node_cpus is not None:
        limits["cpus"] = float(params.node_cpus)
    if params.node_memory is not None:
        limits["mem_limit"] = limits["memswap_limit"] = params.node_memory.lower()
    if params.node_environment:
        limits["environment"] = dict(params.node_environment)
    # the bouquet image of the households: a given (pre-built) one, or the ServerApp's, built here
    node_app = {"image": params.node_app_image} if params.node_app_image else {"image": app_image,
                                                                                "build": _app_build()}
    single = params.node_layout == "single"
    for k in range(params.nodes):
        port = f"${{NODE_{k}_PORT:-{FIRST_NODE_PORT + k}}}"
        auth = ["--auth-supernode-private-key", "/keys/node"] if params.tls else []
        household = f"${{HOUSEHOLDS:-./deploy/households}}/node-{k}.csv:/data/household.csv:ro"
        supernode = {"network_mode": "host",
                     "image": params.node_image or "${FLWR_SUPERNODE_IMAGE:-flwr/supernode:1.42.0}",
                     "entrypoint": ["flower-supernode"], "depends_on": ["superlink"], **restart, **limits,
                     "command": client_security + auth + [
                         "--superlink", superlink_address, "--isolation", "subprocess" if single else "process",
                         "--host", "${NODE_BIND:-127.0.0.1}", "--port", port,
                         "--node-config",
                         f'partition-id={k} num-partitions={params.nodes} data-path="/data/household.csv"']}
        volumes = ([f"{ca}:/certs/ca.crt:ro", f"${{CREDENTIALS:-./deploy}}/keys/node{k}:/keys/node:ro"]
                   if params.tls else [])
        if single:  # the SuperNode runs in the bouquet image and starts the ClientApp itself
            services[f"node-{k}"] = {**supernode, **node_app, "volumes": volumes + [household]}
            continue
        if volumes:
            supernode["volumes"] = volumes
        services[f"supernode-{k}"] = supernode
        services[f"clientapp-{k}"] = {
            "network_mode": "host", **restart, **limits, **node_app,
            "command": ["--insecure", "--runtime-api-address", f"${{NODE_{k}_ADDRESS:-127.0.0.1:{FIRST_NODE_PORT + k}}}"],
            "depends_on": [f"supernode-{k}"], "volumes": [household]}
    return services


def fleet_compose(params: FleetParams) -> str:
    """A whole compose file (YAML) for ``params``, with a header that says how it was made and how to run it."""
    options = [f"--nodes {params.nodes}"] + (["--tls"] if params.tls else [])
    options += [f"--{name.replace('_', '-')} {getattr(params, name)}"
                for name in ("node_platform", "node_image", "node_app_image", "node_cpus", "node_memory")
                if getattr(params, name) is not None]
    options += [f"--node-env {name}={value}" for name, value in params.node_environment]
    options += [f"--restart {params.restart}"] if params.restart != "on-failure" else []
    options += [f"--node-layout {params.node_layout}"] if params.node_layout != "pair" else []
    header = (f"# Generated by `python -m bouquet.fleet {' '.join(options)}`; edit the options, not this file.\n"
              f"# {params.nodes} households: "
              + ("node-K (SuperNode + its ClientApp in one container)" if params.node_layout == "single"
                 else "supernode-K + clientapp-K") + ", node K reading "
              "${HOUSEHOLDS}/node-K.csv, ClientApp port ${NODE_K_PORT:-9094+K}.\n"
              "#   docker compose -f THIS_FILE up -d            # then: flwr run . <connection> --stream\n"
              "# Variables, TLS keys and adding/removing a household: docs/DEPLOY.md.\n")
    body = yaml.safe_dump({"version": "3.8", "services": fleet_services(params)}, sort_keys=False,
                          default_flow_style=None, width=120)
    return header + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bouquet.fleet", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=FleetParams.nodes, help="households (default %(default)s)")
    parser.add_argument("--tls", action="store_true", help="TLS + SuperNode authentication in the file")
    parser.add_argument("--node-platform", default=None, choices=_PLATFORMS, help="households' platform")
    parser.add_argument("--node-image", default=None, help="SuperNode image (default: as docker-compose.yml)")
    parser.add_argument("--node-app-image", default=None, help="ClientApp image, already built (default: built)")
    parser.add_argument("--node-cpus", type=float, default=None, help="cpus limit per household container")
    parser.add_argument("--node-memory", default=None, help="memory limit per household container, e.g. 512m")
    parser.add_argument("--restart", default=FleetParams.restart, help="restart policy (default %(default)s)")
    parser.add_argument("--node-layout", default=FleetParams.node_layout, choices=_LAYOUTS,
                        help="pair: SuperNode + ClientApp containers; single: one container per household")
    parser.add_argument("--node-env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment variable of every household container (repeatable)")
    parser.add_argument("--out", required=True, help="where to write the compose file")
    args = parser.parse_args(argv)
    bad = [item for item in args.node_env if "=" not in item]
    if bad:
        parser.error(f"--node-env takes NAME=VALUE, got {bad[0]!r}")
    try:
        params = FleetParams(nodes=args.nodes, tls=args.tls, node_platform=args.node_platform,
                             node_image=args.node_image, node_app_image=args.node_app_image,
                             node_cpus=args.node_cpus, node_memory=args.node_memory, restart=args.restart,
                             node_layout=args.node_layout,
                             node_environment=tuple(tuple(item.split("=", 1)) for item in args.node_env))
    except ValueError as error:
        parser.error(str(error))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(fleet_compose(params))
    print(f"wrote {out}: {params.nodes} households" + (" with TLS + node auth" if params.tls else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
