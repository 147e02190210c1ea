"""Start and stop local Flower processes (a SuperLink) for runs and tests, by PID, on 127.0.0.1.

Used by the end-to-end tests and the scripts: a private SuperLink on a free
loopback port with its own ``FLWR_HOME``, so that nothing is left running and
no user configuration is touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pathspec

from bouquet.processes import (
    LOOPBACK_RAY,
    check_ray_address,
    flower_bin,
    flwr,
    free_port,
    loopback_ray_head,
    offline_env,
    port_open,
    start,
    stop,
    terminate_as_exit,
    wait_until,
)
from bouquet.superlink import superlink_command

if TYPE_CHECKING:
    import argparse

    from bouquet.config import AppConfig
    from bouquet.runtime import WarmRuntime

__all__ = ["LocalSuperLink", "app_config", "app_files", "failed_runs", "federation_config", "free_port",
           "local_superlink", "offline_env", "staged_app", "unfinished_runs"]

#: Folders never part of an app's source: git's own, and those Flower's app build leaves out itself.
_NEVER_APP = frozenset({".git", ".venv", ".flwr", "__pycache__"})


def app_files(app_dir: Path) -> list[str]:
    """The files under ``app_dir`` that can be part of its Flower app, as POSIX paths relative to it.

    Walks the folder without entering the folders its ``.gitignore`` excludes (``.venv/``, ``results/``,
    ...) nor ``.git``, ``.flwr`` and ``__pycache__``, and leaves out ignored files and symlinks.  Flower's
    ``flwr run``/``flwr build`` (1.42) resolve every file of the folder before they apply ``.gitignore``:
    75,000 files and 9-11 s in this repository with its virtual environment and results, on every run.
    """
    app_dir = Path(app_dir)
    gitignore = app_dir / ".gitignore"
    spec = pathspec.GitIgnoreSpec.from_lines(gitignore.read_text().splitlines() if gitignore.is_file() else [])
    kept = []
    for folder, subfolders, names in os.walk(app_dir):
        relative = Path(folder).relative_to(app_dir)
        subfolders[:] = sorted(d for d in subfolders if d not in _NEVER_APP
                               and not (Path(folder) / d).is_symlink()
                               and not spec.match_file((relative / d).as_posix() + "/"))
        for name in names:
            path = (relative / name).as_posix()
            if not (Path(folder) / name).is_symlink() and not spec.match_file(path):
                kept.append(path)
    return sorted(kept)


@contextmanager
def staged_app(app_dir: Path) -> Iterator[Path]:
    """A temporary copy of :func:`app_files` of ``app_dir``: the same Flower app, quick to build.

    Flower builds the same FAB from it (same files, same hash; a test checks this repository's), and the
    run's working directory, hence where its results go, does not change.
    """
    with tempfile.TemporaryDirectory(prefix="bouquet-stage-") as folder:
        stage = Path(folder) / "bouquet-app"  # a name `flwr build` accepts (a letter first, no underscore)
        for relative in app_files(app_dir):
            target = stage / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(app_dir) / relative, target)
        yield stage


def flwr_run_app(app_dir: Path, connection: str, flwr_home: Path, run_config: str = "", federation_config: str = "",
                 timeout: float | None = 600, capture: bool = True) -> subprocess.CompletedProcess:
    """``flwr run <app_dir> <connection> --stream`` from :func:`staged_app`, with ``run_config`` as
    :func:`preset_applied` makes it and ``federation_config`` if given (every ``flwr run`` bouquet starts)."""
    with staged_app(app_dir) as staged:
        args = ["run", str(staged), connection, "--stream"]
        if run_config:
            args += ["--run-config", preset_applied(run_config, staged.parent)]
        if federation_config:
            args += ["--federation-config", federation_config]
        return flwr(args, flwr_home, timeout=timeout, capture=capture)


@dataclass
class LocalSuperLink:
    """A running SuperLink and the ``FLWR_HOME`` whose config names it ``connection``.

    ``process`` is the SuperLink this object started (:meth:`stop` ends it), or None for one that runs on its
    own, such as a warm runtime's (:meth:`stop` leaves it running).
    """

    process: subprocess.Popen | None
    port: int
    flwr_home: Path
    connection: str = "bouquet-local"

    def flwr_run(self, app_dir: Path, run_config: str = "", federation_config: str = "",
                 timeout: float | None = 600, capture: bool = True) -> subprocess.CompletedProcess:
        """``flwr run <app_dir> <connection> --stream`` with the given overrides, from :func:`staged_app`.

        Output is captured (``capture=True``) or streamed to this terminal.
        """
        return flwr_run_app(app_dir, self.connection, self.flwr_home, run_config, federation_config,
                            timeout=timeout, capture=capture)

    def run_statuses(self) -> str:
        """``flwr ls`` of this SuperLink (every run's status and, for a failed one, Flower's details, e.g. "No
        heartbeat received from the task"), or why it could not be listed."""
        done = flwr(["ls", self.connection, "--format", "json"], self.flwr_home, timeout=60)
        return done.stdout if done.returncode == 0 else f"flwr ls failed: {done.stdout}{done.stderr}"

    def run_log(self, run_id: int) -> str:
        """Flower's stored log of run ``run_id`` (``flwr log --show``), whole: ``flwr run --stream`` can end before
        the last lines of a run that fails at once (its stream polls, and stops when the run has finished)."""
        done = flwr(["log", str(run_id), self.connection, "--show"], self.flwr_home, timeout=120)
        return done.stdout + done.stderr

    def stop(self) -> None:
        """Terminate the SuperLink this object started (and the processes it started) by PID."""
        if self.process is not None:
            stop(self.process)


@contextmanager
def local_superlink(workdir: Path, simulation: bool = True, extra_args: list[str] | None = None,
                    startup_seconds: float = 60, env: dict[str, str] | None = None,
                    state_database: bool = False, ray_loopback: bool = True) -> Iterator[LocalSuperLink]:
    """Start ``flower-superlink`` on 127.0.0.1 (simulation runtime by default); stop it on exit.

    ``workdir`` receives the ``FLWR_HOME``, the log and (``state_database``) the state database.  ``env`` adds variables to
    the SuperLink's environment, e.g. ``{"RAY_ADDRESS": "head:6379"}`` so that simulations join an
    existing Ray cluster instead of starting a private one (docs/DEPLOY.md, "Scale-out").  ``ray_loopback``: see
    :func:`start_superlink`.  A SIGTERM to this (main-thread) process stops the SuperLink too.
    """
    with terminate_as_exit():
        yield from _superlink(Path(workdir), simulation, extra_args, startup_seconds, env, state_database,
                              ray_loopback)


def _superlink(workdir: Path, simulation: bool, extra_args: list[str] | None, startup_seconds: float,
               env: dict[str, str] | None, state_database: bool, ray_loopback: bool) -> Iterator[LocalSuperLink]:
    link = start_superlink(workdir, simulation, extra_args, startup_seconds, env, state_database, ray_loopback)
    try:
        yield link
    finally:
        link.stop()


def write_connection(flwr_home: Path, port: int) -> None:
    """``FLWR_HOME/config.toml`` naming the SuperLink on 127.0.0.1:``port`` ``bouquet-local`` (insecure)."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "bouquet-local"\n\n[superlink.bouquet-local]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n')


def start_superlink(workdir: Path, simulation: bool = True, extra_args: list[str] | None = None,
                    startup_seconds: float = 60, env: dict[str, str] | None = None,
                    state_database: bool = False, ray_loopback: bool = True) -> LocalSuperLink:
    """Start ``flower-superlink`` on 127.0.0.1 in ``workdir`` and wait until it listens; the caller stops it.

    The SuperLink keeps its state in memory (Flower's default) unless ``state_database``, then in
    ``workdir/state.db`` (SQLite).  In memory is what local runs need (bouquet's checkpoints, not Flower's
    state, carry a resume), and it closes the door to "No heartbeat received from the task": with the SQLite
    state, any write that waits more than SQLite's busy timeout (5 s) answers HTTP 500, and Flower 1.42's
    heartbeat thread ends on the first 500 it gets, so the run is failed up to 60 s later
    (docs/RELIABILITY.md; ``scripts/heartbeat_probe.py --state-database --lock-db-at``).

    ``ray_loopback`` (the default) keeps the Ray of its simulations on 127.0.0.1 (:data:`LOOPBACK_RAY`): the
    private Ray a simulation starts, or a head started the same way (:class:`bouquet.runtime.RayHead`).  Turn
    it off only to join a multi-node Ray cluster (``RAY_ADDRESS`` of a head on a network address).
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    flwr_home = workdir / "flwr-home"
    port = free_port()
    write_connection(flwr_home, port)
    flower_args = ["--insecure", "--host", "127.0.0.1", "--port", str(port),
                   *(["--database", str(workdir / "state.db")] if state_database else []),
                   "--disable-runtime-dependency-installation"]
    # a state database: bouquet's SuperLink entry, whose writes wait out a locked database (bouquet.superlink)
    command = superlink_command(flower_args) if state_database else [flower_bin("flower-superlink"), *flower_args]
    if simulation:
        command.append("--simulation")
    command += extra_args or []
    log = workdir / "superlink.log"
    environment = {**offline_env(flwr_home), **(LOOPBACK_RAY if ray_loopback else {}), **(env or {})}
    link = LocalSuperLink(start(command, log, environment), port, flwr_home)
    try:
        wait_until(lambda: port_open(port), link.process, log, startup_seconds,
                   f"flower-superlink on 127.0.0.1:{port}")
    except BaseException:
        link.stop()
        raise
    return link


@contextmanager
def run_superlink(workdir: Path, ray_address: str | None = None, cold: bool = False,
                  runtime_dir: Path | None = None, shared_ray: bool = False) -> Iterator[tuple[LocalSuperLink, str]]:
    """The SuperLink runs use, with a line saying which.

    The warm runtime's if one is recorded (a stale one is cleaned away and started again), unless ``cold`` or a
    ``ray_address`` is given; else a private SuperLink in ``workdir``, stopped on exit, whose simulations start a
    private Ray each, join the cluster at ``ray_address``, or (``shared_ray``, for a series of runs) join one Ray
    head started here for all of them and stopped on exit.
    """
    from bouquet.runtime import RayHead, WarmRuntime

    runtime = WarmRuntime(runtime_dir)
    if not cold and ray_address is None and (runtime.folder / "runtime.json").exists():
        state, what = runtime.up()
        link = LocalSuperLink(None, state.superlink_port, Path(state.flwr_home))
        note = "" if what == "already up" else f" ({what})"
        yield link, (f"joining the warm runtime{note}: SuperLink 127.0.0.1:{link.port} (pid {state.superlink_pid}), "
                     f"Ray {state.ray_address} (pid {state.ray_pid})")
        return
    Path(workdir).mkdir(parents=True, exist_ok=True)
    ray = RayHead(Path(workdir) / "ray-head.log") if shared_ray and ray_address is None else None
    try:
        address = ray.address if ray is not None else ray_address
        with local_superlink(Path(workdir), env={"RAY_ADDRESS": address} if address else None,
                             ray_loopback=ray_address is None or loopback_ray_head(ray_address)) as link:
            ray_note = (f", Ray head {address} (pid {ray.process.pid}) for these runs" if ray is not None
                        else f", Ray {address}" if address else "")
            yield link, f"private SuperLink on 127.0.0.1:{link.port} (pid {link.process.pid}){ray_note}"
    finally:
        if ray is not None:
            ray.stop()


def parse_overrides(text: str) -> dict:
    """Flower's ``--run-config`` string (``k1=v1 k2="s"``, TOML values) as a dict."""
    import re
    import tomllib

    pairs = re.findall(r"""([A-Za-z0-9_-]+)\s*=\s*("[^"]*"|'[^']*'|\S+)""", text)
    return tomllib.loads("\n".join(f"{key} = {value}" for key, value in pairs))


def preset_applied(run_config: str, folder: Path) -> str:
    """``run_config`` (a ``--run-config`` string, or the path of a TOML file) for ``flwr run``, with the file of
    the ``forecaster`` preset it names under it (:func:`bouquet.config.with_preset`): written to
    ``folder/run-config.toml``, whose path is returned.  Flower takes one TOML file or key-value strings, not
    both, hence the one file.  A water run config that names no preset is returned as it is."""
    import tomllib

    from bouquet.config import with_preset

    is_file = run_config.endswith(".toml")
    overrides = tomllib.loads(Path(run_config).read_text()) if is_file else parse_overrides(run_config)
    resolved = with_preset(overrides)
    if resolved == overrides:
        return run_config
    target = Path(folder) / "run-config.toml"
    target.write_text("".join(f"{key} = {toml_value(value)}\n" for key, value in resolved.items()))
    return str(target)


def toml_value(value: object) -> str:
    """A Python scalar as a TOML value (for ``--run-config`` strings and files)."""
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, int | float):
        return repr(value)
    raise ValueError(f"not a run-config scalar: {value!r}")


def format_overrides(values: dict) -> str:
    """The inverse of :func:`parse_overrides`: ``values`` as a ``--run-config`` string (TOML scalars)."""
    quoted = [k for k, v in values.items() if isinstance(v, str) and '"' in v]
    if quoted:
        raise ValueError(f"a run-config string cannot hold a double quote: {', '.join(quoted)}")
    return " ".join(f"{key}={toml_value(value)}" for key, value in values.items())


def resume_overrides(folder: Path, run_config: str = "") -> str:
    """The ``--run-config`` that resumes the run in ``folder``: its ``config.json``, then ``run_config``."""
    import json

    saved = folder / "config.json"
    if not saved.is_file():
        raise SystemExit(f"--resume: {folder} has no config.json; is it a bouquet run folder?")
    values = {**json.loads(saved.read_text()), **parse_overrides(run_config), "resume-from": str(folder.resolve())}
    return format_overrides(values)


def federation_config(supernodes: int, cpus_per_client: float = 1.0, gpus_per_client: float = 0.0) -> str:
    """Flower's ``--federation-config`` for a simulation of ``supernodes`` nodes, each Ray actor holding
    ``cpus_per_client`` CPUs and ``gpus_per_client`` GPUs (Ray hides every GPU from an actor that holds none,
    so a node's ``vision-device = "cuda"`` needs ``gpus_per_client`` > 0; 0.5 puts two actors on a GPU)."""
    if supernodes < 1:
        raise ValueError(f"need at least one SuperNode, got {supernodes}")
    if cpus_per_client <= 0 or gpus_per_client < 0:
        raise ValueError(f"need cpus-per-client > 0 and gpus-per-client >= 0, got {cpus_per_client:g} and "
                         f"{gpus_per_client:g}")
    gpus = f" client-resources-num-gpus={gpus_per_client:g}" if gpus_per_client > 0 else ""
    return f"num-supernodes={supernodes} client-resources-num-cpus={cpus_per_client:g}{gpus}"


#: SuperNodes of a vision run when none are given (the SCKM paper's 10-client setting).
VISION_CLIENTS = 10


def pool_size(app_dir: Path, run_config: str) -> int:
    """Clients for the app's run config plus ``run_config`` overrides.

    Water: the households of the federated pool.  Vision: :data:`VISION_CLIENTS`.
    """
    from bouquet.data.water import load_pool

    config = app_config(app_dir, run_config)
    if config.run.task == "vision":
        return VISION_CLIENTS
    return len(load_pool(config.water_data))


def app_config(app_dir: Path, run_config: str) -> AppConfig:
    """The app's run config (``[tool.flwr.app.config]`` of its ``pyproject.toml``) with ``run_config`` overrides."""
    import tomllib

    from bouquet.config import AppConfig, with_preset

    defaults = tomllib.loads((Path(app_dir) / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    return AppConfig.from_run_config({**defaults, **with_preset(parse_overrides(run_config))})


def unfinished_runs(results_dir: Path, before: set[Path]) -> list[Path]:
    """Run folders under ``results_dir`` not in ``before`` that hold a checkpoint but no ``summary.json``: the runs
    a failed ``flwr run`` left behind that ``--resume`` can go on with (oldest name first)."""
    from bouquet.checkpoint import list_checkpoints

    folders = sorted(config.parent for config in Path(results_dir).glob("*/config.json"))
    return [folder for folder in folders
            if folder not in before and not (folder / "summary.json").exists() and list_checkpoints(folder)]


def main(argv: list[str] | None = None) -> int:
    """``python -m bouquet.launch``: run the app in simulation (on the warm runtime if one is up, else on a
    private SuperLink and Ray, stopped after the run), or start / stop / show the warm runtime."""
    import argparse
    import tempfile

    from bouquet.runtime import WarmRuntime

    parser = argparse.ArgumentParser(prog="python -m bouquet.launch", description=main.__doc__)
    parser.add_argument("app", nargs="?", default=".", help="Flower app folder (holds pyproject.toml)")
    parser.add_argument("--supernodes", type=int, default=None,
                        help="simulated SuperNodes (households); default: the size of the federated pool")
    parser.add_argument("--cpus-per-client", type=float, default=1.0)
    parser.add_argument("--gpus-per-client", type=float, default=0.0,
                        help="GPUs each simulated client's Ray actor holds (0.5: two a GPU); with "
                             "vision-device=\"cuda\" or \"auto\" the vision task then trains there")
    parser.add_argument("--run-config", default="", help="overrides, e.g. 'num-server-rounds=5 seed=1'")
    parser.add_argument("--ray-address", default=None,
                        help="join this existing Ray cluster (head:port) instead of starting a private Ray")
    parser.add_argument("--resume", default=None, metavar="RUN_FOLDER",
                        help="go on with an interrupted run from its last checkpoint, with its config.json "
                             "(--run-config may add resume-allow-rounds=true num-server-rounds=N)")
    runtime = parser.add_argument_group("warm runtime (one SuperLink and one Ray head on 127.0.0.1 that runs join)")
    action = runtime.add_mutually_exclusive_group()
    action.add_argument("--up", action="store_true", help="start the warm runtime (nothing if it is up) and exit")
    action.add_argument("--down", action="store_true", help="stop the warm runtime by PID and exit")
    action.add_argument("--status", action="store_true", help="show the warm runtime and exit")
    action.add_argument("--cold", action="store_true",
                        help="run on a private SuperLink and Ray even when the warm runtime is up")
    runtime.add_argument("--runtime-dir", type=Path, default=None,
                         help="the warm runtime's folder (default: $BOUQUET_RUNTIME_DIR or ~/.cache/bouquet/runtime)")
    runtime.add_argument("--num-cpus", type=int, default=None,
                         help="with --up: CPUs the Ray head hands to ClientApp actors (default: all)")
    args = parser.parse_args(argv)
    if args.up or args.down or args.status:
        return _runtime_command(WarmRuntime(args.runtime_dir), args)
    if args.ray_address:
        try:
            check_ray_address(args.ray_address)
        except ValueError as exc:
            parser.exit(2, f"bouquet: {exc}\n")
    if args.resume:
        args.run_config = resume_overrides(Path(args.resume), args.run_config)
        print(f"bouquet: resuming {Path(args.resume).resolve()}", flush=True)
    if args.supernodes is None:
        args.supernodes = pool_size(Path(args.app), args.run_config)
        print(f"bouquet: {args.supernodes} SuperNodes (one per household of the pool, or the vision default)",
              flush=True)
    try:
        federation = federation_config(args.supernodes, args.cpus_per_client, args.gpus_per_client)
    except ValueError as exc:
        parser.exit(2, f"bouquet: {exc}\n")
    results_dir = Path(app_config(Path(args.app), args.run_config).run.results_dir).expanduser().resolve()
    before = {config.parent for config in results_dir.glob("*/config.json")}
    with tempfile.TemporaryDirectory(prefix="bouquet-link-") as workdir, \
            run_superlink(Path(workdir), args.ray_address, args.cold, args.runtime_dir) as (link, which):
        print(f"bouquet: {which}", flush=True)
        earlier = run_ids(link.run_statuses())
        done = link.flwr_run(Path(args.app), args.run_config, federation, timeout=None, capture=False)
        failed = failed_runs(link.run_statuses(), earlier)
    for line in failed:  # flwr run --stream exits 0 whatever became of the run
        print(f"bouquet: {line}", flush=True)
    if failed or done.returncode:
        for folder in unfinished_runs(results_dir, before):
            print(f"bouquet: {folder} stopped before its last round; go on from its newest checkpoint with\n"
                  f"    python -m bouquet.launch {args.app} --resume {folder}", flush=True)
    return done.returncode or (1 if failed else 0)


def _runtime_command(runtime: WarmRuntime, args: argparse.Namespace) -> int:
    """``--up`` / ``--down`` / ``--status``."""
    if args.status:
        print(runtime.describe(), flush=True)
        return 0
    if args.down:
        print(f"bouquet: {runtime.down()}", flush=True)
        return 0
    try:
        state, what = runtime.up(num_cpus=args.num_cpus)
    except (RuntimeError, TimeoutError) as exc:
        print(f"bouquet: could not start the warm runtime in {runtime.folder}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"bouquet: warm runtime {what}: SuperLink 127.0.0.1:{state.superlink_port} (pid {state.superlink_pid}), "
          f"Ray {state.ray_address} (pid {state.ray_pid}); runs of `python -m bouquet.launch` join it until "
          f"`python -m bouquet.launch --down`", flush=True)
    return 0


def run_ids(statuses: str) -> set[str]:
    """The run ids in ``flwr ls --format json`` output (empty when it is not such a listing)."""
    import json

    try:
        return {str(r.get("run-id")) for r in json.loads(statuses).get("runs", [])}
    except (ValueError, AttributeError):
        return set()


def failed_runs(statuses: str, earlier: set[str] = frozenset()) -> list[str]:
    """One line per run of ``flwr ls --format json`` output that did not finish ``completed`` (status and
    Flower's details), leaving out the run ids in ``earlier``; a listing that is not JSON is one line itself."""
    import json

    try:
        runs = json.loads(statuses).get("runs", [])
    except (ValueError, AttributeError):
        return [f"could not read the runs' status: {statuses.strip()[:500]}"]
    return [f"run {r.get('run-id')} ended {r.get('status')}" + (f": {r['status-details']}" if r.get("status-details")
                                                               else "")
            for r in runs if r.get("status") != "finished:completed" and str(r.get("run-id")) not in earlier]


if __name__ == "__main__":
    raise SystemExit(main())
