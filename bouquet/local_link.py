"""A private SuperLink on 127.0.0.1 and ``flwr run`` of an app on it, by PID.

Used by :mod:`bouquet.launch`, the warm runtime (:mod:`bouquet.runtime`), the deployments
(:mod:`bouquet.deploy`), the end-to-end tests and the scripts: a SuperLink on a free loopback port with its own
``FLWR_HOME``, so that nothing is left running and no user configuration is touched; an app staged without its
ignored files; a run config with the preset it names applied.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pathspec

from bouquet.processes import (
    LOOPBACK_RAY,
    flower_bin,
    flwr,
    free_port,
    offline_env,
    port_open,
    start,
    stop,
    terminate_as_exit,
    wait_until,
)
from bouquet.superlink import superlink_command

__all__ = ["LocalSuperLink", "app_files", "flwr_run_app", "format_overrides", "local_superlink", "parse_overrides",
           "preset_applied", "staged_app", "start_superlink", "toml_value", "write_connection"]

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


