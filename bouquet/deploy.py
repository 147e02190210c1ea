"""Deployment with real Flower processes: a SuperLink and N SuperNodes, TLS and SuperNode auth.

    python -m bouquet.deploy --nodes 3 --run-config 'num-server-rounds=2 clients-per-round=3'
    python -m bouquet.deploy --nodes 3 --daiad ../shared/data/daiad/swm_trialA.zip --insecure

Secure by default: a private CA and a server certificate for the SuperLink's
address (``make_certificates``), one ECDSA key pair per SuperNode
(``make_node_key``) registered with the SuperLink (``flwr supernode
register``; the SuperLink runs with ``--enable-supernode-auth``), and
SuperNodes that trust only the CA.  ``--insecure`` switches all of that off.
Every process runs on 127.0.0.1, in its own process group, and is stopped by
PID on exit, on failure and on Ctrl-C.

Each SuperNode gets its household through ``--node-config``: ``partition-id``
and, with ``--daiad``, a ``data-path`` to a file holding only that household's
readings (split from the DAIAD file into the work folder), so no data travels
from the server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bouquet.launch import flwr_run_app
from bouquet.processes import descendants, flower_bin, flwr, free_port, offline_env, start, stop, wait_until
from bouquet.superlink import DEFAULT_BUSY_TIMEOUT_S, superlink_command

__all__ = ["Deployment", "deployment", "make_certificates", "make_node_key", "split_households", "start_supernode",
           "wait_for_nodes"]


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done


def make_certificates(folder: Path, address: str | list[str] = "127.0.0.1", days: int = 365) -> dict[str, Path]:
    """A private CA and a server key/certificate signed by it, valid for ``address`` (openssl).

    ``address`` is one name or IP, or a list (e.g. ``["127.0.0.1", "superlink"]`` for the Docker stack);
    IPs become IP SANs, names DNS SANs.
    """
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = folder / "ca.key", folder / "ca.crt"
    key, csr, crt = folder / "server.key", folder / "server.csr", folder / "server.pem"
    _run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca_crt),
          "-days", str(days), "-subj", "/CN=bouquet-ca"])
    _run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
          "-subj", "/CN=bouquet-superlink"])
    extensions = folder / "server.ext"
    names = [address] if isinstance(address, str) else list(address)
    san = ", ".join(f"IP:{a}" if a.replace(".", "").isdigit() else f"DNS:{a}" for a in names)
    extensions.write_text(f"subjectAltName = {san}\nbasicConstraints = CA:FALSE\n"
                          "keyUsage = digitalSignature, keyEncipherment\nextendedKeyUsage = serverAuth\n")
    _run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-CAcreateserial",
          "-out", str(crt), "-days", str(days), "-sha256", "-extfile", str(extensions)])
    return {"ca": ca_crt, "cert": crt, "key": key}


def make_node_key(folder: Path, name: str) -> tuple[Path, Path]:
    """An ECDSA (P-384) key pair for SuperNode authentication: (private key, public key)."""
    folder.mkdir(parents=True, exist_ok=True)
    private = folder / name
    for stale in (private, private.with_suffix(".pub")):
        stale.unlink(missing_ok=True)
    _run(["ssh-keygen", "-t", "ecdsa", "-b", "384", "-N", "", "-q", "-f", str(private), "-C", ""])
    return private, Path(str(private) + ".pub")


def split_households(daiad_path: Path, folder: Path, households: list[str]) -> list[Path]:
    """One DAIAD-format CSV per household (original rows and header), for one SuperNode each."""
    import pandas as pd

    from bouquet.data.daiad import _open_text, _read_header

    _read_header(daiad_path)  # clear error for a wrong file
    folder.mkdir(parents=True, exist_ok=True)
    with _open_text(daiad_path) as handle:
        frame = pd.read_csv(handle, sep=";", dtype=str)
    key = frame.columns[0]
    paths = []
    for household in households:
        path = folder / f"{household}.csv"
        frame[frame[key] == household].to_csv(path, sep=";", index=False)
        paths.append(path)
    return paths


@dataclass
class Deployment:
    """Running SuperLink (+ its FLWR_HOME connection) and the SuperNodes started so far."""

    workdir: Path
    port: int
    flwr_home: Path
    secure: bool
    superlink: subprocess.Popen
    supernodes: dict[int, subprocess.Popen] = field(default_factory=dict)
    certificates: dict[str, Path] = field(default_factory=dict)
    connection: str = "bouquet-deploy"
    command: list[str] = field(default_factory=list)

    def unfinished_runs(self) -> list[int]:
        """Ids of the runs the SuperLink lists as not finished (pending, starting or running)."""
        return [int(r["run-id"]) for r in self.runs() if not str(r.get("status", "")).lower().startswith("finished")]

    def runs(self) -> list[dict]:
        """Flower's listing of the SuperLink's runs (``flwr ls --format json``): id, status, details, ..."""
        return json.loads(self._flwr_checked("ls", self.connection, "--format", "json").stdout).get("runs", [])

    def wait_for_runs(self, timeout: float = 900, interval: float = 3) -> list[dict]:
        """Wait until no run is unfinished (``flwr run --stream`` may return while its run goes on, when its log
        stream is cut); Flower's listing of the runs."""
        deadline = time.monotonic() + timeout
        while self.unfinished_runs() and time.monotonic() < deadline:
            time.sleep(interval)
        return self.runs()

    def stop_run(self, run_id: int) -> None:
        """``flwr stop``: end a run, e.g. one whose ServerApp died with the SuperLink."""
        self._flwr_checked("stop", str(run_id), self.connection)

    def restart_superlink(self, crash: bool = True, startup_seconds: float = 60) -> None:
        """Stop the SuperLink and what it started (``crash``: SIGKILL, as a power cut) and start it again on the
        same port and state database; the SuperNodes stay up and reconnect by themselves."""
        if crash:
            for pid in descendants(self.superlink.pid):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with suppress(ProcessLookupError):
                os.killpg(self.superlink.pid, signal.SIGKILL)
            self.superlink.wait()
        else:
            stop(self.superlink)
        self.superlink = start(self.command, self.workdir / "superlink.log", offline_env(self.flwr_home), append=True)
        wait_until(lambda: self.flwr("supernode", "list", self.connection, timeout=60).returncode == 0,
                   self.superlink, self.workdir / "superlink.log", startup_seconds,
                   f"SuperLink on 127.0.0.1:{self.port}", interval=0.5)

    def flwr(self, *args: str, timeout: float | None = 600, capture: bool = True) -> subprocess.CompletedProcess:
        """A ``flwr`` command against this deployment's connection."""
        return flwr(list(args), self.flwr_home, timeout=timeout, capture=capture)

    def _flwr_checked(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """``flwr(*args)`` that raises, with its output, when the command fails."""
        done = self.flwr(*args, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"flwr {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done

    def register(self, public_key: Path) -> int:
        """Register a SuperNode's public key with the running SuperLink (``flwr supernode register``); the
        node id it gets."""
        done = self._flwr_checked("supernode", "register", str(public_key), self.connection, "--format", "json",
                                  timeout=600)
        return int(json.loads(done.stdout)["node-id"])

    def unregister(self, node_id: int) -> None:
        """Remove a node from the running SuperLink (``flwr supernode unregister``): its key can no longer
        connect; no restart of the SuperLink."""
        self._flwr_checked("supernode", "unregister", str(node_id), self.connection, timeout=600)

    def run(self, app_dir: Path, run_config: str = "", timeout: float | None = 900,
            capture: bool = True) -> subprocess.CompletedProcess:
        """``flwr run`` of the app in ``app_dir`` on this deployment (the app's files only: see
        :func:`bouquet.launch.app_files`)."""
        return flwr_run_app(app_dir, self.connection, self.flwr_home, run_config, timeout=timeout, capture=capture)


def start_supernode(deploy: Deployment, partition_id: int, data_path: Path | None = None,
                    private_key: Path | None = None, root_certificates: Path | None = None,
                    insecure: bool | None = None, num_partitions: int | None = None) -> subprocess.Popen:
    """Start one ``flower-supernode`` for ``partition_id`` (log: ``workdir/supernode-<id>.log``).

    ``num_partitions`` (the federation's size) goes into the node config when given: attacked runs need it
    to draw the attackers (``bouquet.client_app.is_attacker``).
    """
    node_config = f"partition-id={partition_id}"
    if num_partitions is not None:
        node_config += f" num-partitions={num_partitions}"
    if data_path is not None:
        node_config += f' data-path="{data_path}"'
    command = [flower_bin("flower-supernode"), "--superlink", f"127.0.0.1:{deploy.port}", "--node-config", node_config,
               "--host", "127.0.0.1", "--port", str(free_port())]
    if (not deploy.secure) if insecure is None else insecure:
        command.append("--insecure")
    else:
        command += ["--root-certificates", str(root_certificates or deploy.certificates["ca"])]
    if private_key is not None:
        command += ["--auth-supernode-private-key", str(private_key)]
    process = start(command, deploy.workdir / f"supernode-{partition_id}.log", offline_env(deploy.flwr_home),
                    append=True)
    deploy.supernodes[partition_id] = process
    return process


def wait_for_nodes(deploy: Deployment, count: int, timeout: float = 60) -> int:
    """Wait until ``flwr supernode list`` shows ``count`` online nodes; returns how many were seen."""
    deadline, online = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        done = deploy.flwr("supernode", "list", deploy.connection, "--format", "json", timeout=60)
        online = done.stdout.count('"online"')
        if online >= count:
            return online
        time.sleep(2)  # each check is a flwr CLI process (~1.5 s of CPU): poll gently
    return online


@contextmanager
def deployment(workdir: Path, secure: bool = True, startup_seconds: float = 60,
               state_busy_timeout: float | None = DEFAULT_BUSY_TIMEOUT_S) -> Iterator[Deployment]:
    """Start a SuperLink on 127.0.0.1 (TLS + SuperNode auth unless ``secure=False``); stop everything on exit.

    The SuperLink keeps its state in ``workdir/state.db`` (a restarted one finds its runs there) and is
    :mod:`bouquet.superlink`, whose writes wait ``state_busy_timeout`` s for a locked database; ``None``
    starts Flower's ``flower-superlink`` as it is (5 s, then HTTP 500: docs/RELIABILITY.md).
    """
    workdir = Path(workdir)
    flwr_home = workdir / "flwr-home"
    flwr_home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    flower_args = ["--host", "127.0.0.1", "--port", str(port), "--database", str(workdir / "state.db"),
                   "--disable-runtime-dependency-installation"]
    command = ([flower_bin("flower-superlink"), *flower_args] if state_busy_timeout is None
               else superlink_command(flower_args, state_busy_timeout))
    certificates: dict[str, Path] = {}
    if secure:
        certificates = make_certificates(workdir / "certificates")
        command += ["--ssl-ca-certfile", str(certificates["ca"]), "--ssl-certfile", str(certificates["cert"]),
                    "--ssl-keyfile", str(certificates["key"]), "--enable-supernode-auth"]
        connection = f'root-certificates = "{certificates["ca"]}"\n'
    else:
        command.append("--insecure")
        connection = "insecure = true\n"
    (flwr_home / "config.toml").write_text(f'[superlink]\ndefault = "bouquet-deploy"\n\n[superlink.bouquet-deploy]\n'
                                           f'address = "127.0.0.1:{port}"\n{connection}')
    superlink = start(command, workdir / "superlink.log", offline_env(flwr_home))
    deploy = Deployment(workdir, port, flwr_home, secure, superlink, certificates=certificates, command=command)
    with ExitStack() as stack:
        stack.callback(lambda: [stop(p) for p in [*deploy.supernodes.values(), deploy.superlink]])
        wait_until(lambda: deploy.flwr("supernode", "list", deploy.connection, timeout=60).returncode == 0,
                   superlink, workdir / "superlink.log", startup_seconds, f"SuperLink on 127.0.0.1:{port}",
                   interval=0.5)
        yield deploy


def export_synthetic_households(folder: Path, count: int, seed: int = 0, households: int = 1099) -> list[Path]:
    """The first ``count`` synthetic households of the pool, each as a DAIAD-format CSV (hourly readings).

    Lets a deployment (and the Docker stack) give every node a file with only
    its own household without the DAIAD release: the node reads it exactly as
    it would read its meter export.
    """
    import pandas as pd

    from bouquet.config import AppConfig
    from bouquet.data.synthetic import generate_household
    from bouquet.data.water import load_pool

    config = AppConfig.from_run_config({"data-seed": seed, "synthetic-households": households})
    pool = load_pool(config.water_data)
    if count > len(pool):
        raise ValueError(f"{count} households requested, the synthetic pool has {len(pool)}")
    folder.mkdir(parents=True, exist_ok=True)
    synthetic = config.water_data.synthetic
    paths = []
    for member in pool.households[:count]:
        house = generate_household(int(member.household_id.removeprefix("syn-")), synthetic)
        hours = house.first_day.astype("datetime64[h]") + np.arange(len(house.hourly)).astype("timedelta64[h]")
        frame = pd.DataFrame({"user key": house.household_id,
                              "datetime": pd.to_datetime(hours).strftime("%d/%m/%Y %H:%M:%S"),
                              "meter reading": np.cumsum(house.hourly).astype(np.int64),
                              "diff": house.hourly.astype(np.int64)})
        path = folder / f"{house.household_id}.csv"
        frame.to_csv(path, sep=";", index=False)
        paths.append(path)
    return paths


def node_files(folder: Path, count: int, daiad: Path | None = None) -> list[Path]:
    """``node-K.csv`` for K < count in ``folder``: one household each, from ``daiad`` or synthetic.

    From ``daiad``: the first households of the pool, in the pool's order, whose own file passes the default
    job's data checks on a node (its split, here with ``min-history-days = 300``), so that a node never gets a
    household it would refuse."""
    if daiad is not None:
        from bouquet.config import DEFAULT_JOB, AppConfig, with_preset
        from bouquet.data.water import InsufficientDataError, load_pool
        from bouquet.tasks.water import node_windows

        config = AppConfig.from_run_config(with_preset({
            "forecaster": DEFAULT_JOB, "data-source": "daiad", "data-path": str(Path(daiad).resolve()),
            "min-history-days": 300, "active-factor": 0.0}))
        candidates = [h.household_id for h in load_pool(config.water_data).households]
        sources = []
        for path in split_households(Path(daiad), folder / "by-household", candidates):
            if len(sources) < count:
                try:
                    node_windows(config.water_data, len(sources), str(path))
                    sources.append(path)
                    continue
                except InsufficientDataError:
                    pass
            path.unlink()
        if len(sources) < count:
            raise InsufficientDataError(f"{daiad}: {len(sources)} households pass a node's data checks, "
                                        f"{count} asked for")
    else:
        sources = export_synthetic_households(folder / "by-household", count)
    paths = []
    for k, source in enumerate(sources):
        target = folder / f"node-{k}.csv"
        source.replace(target)
        paths.append(target)
    (folder / "by-household").rmdir()
    return paths


def main(argv: list[str] | None = None) -> int:
    """``python -m bouquet.deploy``: SuperLink + N SuperNodes on 127.0.0.1, run the app, stop everything."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m bouquet.deploy", description=main.__doc__)
    parser.add_argument("app", nargs="?", default=".", help="Flower app folder (holds pyproject.toml)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--insecure", action="store_true", help="no TLS, no SuperNode authentication")
    parser.add_argument("--daiad", default=None, help="DAIAD file: each node gets a file with only its household")
    parser.add_argument("--run-config", default="", help="overrides, e.g. 'num-server-rounds=2 clients-per-round=3'")
    parser.add_argument("--workdir", default=None, help="keep certificates, keys, logs here (default: temporary)")
    parser.add_argument("--households-only", metavar="DIR", default=None,
                        help="only write DIR/node-K.csv (one household per node, from --daiad or synthetic) and exit;"
                             " the Docker stack mounts these")
    parser.add_argument("--credentials-only", metavar="DIR", default=None,
                        help="only write DIR/certificates (CA + SuperLink certificate for --address) and "
                             "DIR/keys/node<K>[.pub] for --nodes SuperNodes, then exit (for docker/compose.tls.yml)")
    parser.add_argument("--address", nargs="+", default=["127.0.0.1", "superlink"],
                        help="names/IPs the SuperLink certificate is valid for (with --credentials-only)")
    args = parser.parse_args(argv)
    if args.credentials_only:
        folder = Path(args.credentials_only)
        made = make_certificates(folder / "certificates", args.address)
        keys = [make_node_key(folder / "keys", f"node{k}")[1] for k in range(args.nodes)]
        print("\n".join(str(p) for p in [*made.values(), *keys]))
        return 0
    if args.households_only:
        paths = node_files(Path(args.households_only), args.nodes, Path(args.daiad) if args.daiad else None)
        print("\n".join(str(p) for p in paths))
        return 0
    with ExitStack() as stack:
        workdir = Path(args.workdir) if args.workdir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="bouquet-deploy-")))
        workdir.mkdir(parents=True, exist_ok=True)
        data_paths: list[Path | None] = [None] * args.nodes
        run_config = args.run_config
        if args.daiad:
            data_paths = list(node_files(workdir / "node-data", args.nodes, Path(args.daiad)))
            run_config = f'data-source="daiad" min-history-days=300 {run_config}'
        deploy = stack.enter_context(deployment(workdir, secure=not args.insecure))
        print(f"bouquet: SuperLink on 127.0.0.1:{deploy.port} ({'TLS + SuperNode auth' if deploy.secure else 'INSECURE'})"
              f", work folder {workdir}", flush=True)
        for partition in range(args.nodes):
            private = None
            if deploy.secure:
                private, public = make_node_key(workdir / "keys", f"node{partition}")
                deploy.register(public)
            start_supernode(deploy, partition, data_path=data_paths[partition], private_key=private,
                            num_partitions=args.nodes)
        print(f"bouquet: {wait_for_nodes(deploy, args.nodes)} of {args.nodes} SuperNodes online", flush=True)
        done = deploy.run(Path(args.app), run_config, timeout=None, capture=False)
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
