"""A warm local runtime: one Ray head and one SuperLink started once, on 127.0.0.1, that later runs join.

A cold ``python -m bouquet.launch`` starts a SuperLink and, inside the simulation, a private Ray for every run
(~9 s of Ray start-up alone on a 2-core machine).  ``python -m bouquet.launch --up`` starts both once and
leaves them running; every later ``python -m bouquet.launch``, experiment runner and test session joins them
(``RAY_ADDRESS``) until ``--down``.  Each run is still its own Flower run, with its own simulation process,
ServerApp, ClientApp actors and results folder, so a run that joins gives the numbers of a cold run.

The runtime lives in a folder (``$BOUQUET_RUNTIME_DIR``, default ``~/.cache/bouquet/runtime``) holding
``runtime.json`` (PIDs and ports), the logs, the SuperLink's ``FLWR_HOME`` and Ray's session files (the SuperLink
keeps its state in memory).  ``runtime.lock`` serialises ``--up`` / ``--down`` / joining, so two launches racing to start
it start one.  A runtime whose SuperLink or Ray head died is *stale*: whatever is left of it is stopped by PID
and the state removed before a new one starts.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from bouquet.local_link import start_superlink
from bouquet.processes import LOOPBACK_RAY, command_line, free_port, port_open, start, wait_until

__all__ = ["RayHead", "RuntimeState", "WarmRuntime", "default_runtime_dir", "stop_pid"]

#: The file that names a warm runtime's processes.
STATE_FILE = "runtime.json"


def default_runtime_dir() -> Path:
    """``$BOUQUET_RUNTIME_DIR``, else ``~/.cache/bouquet/runtime``."""
    return Path(os.environ.get("BOUQUET_RUNTIME_DIR") or Path.home() / ".cache" / "bouquet" / "runtime")


#: What a SuperLink's command line holds: Flower's entry, or bouquet's (a state database: bouquet.superlink).
SUPERLINK_COMMANDS = ("flower-superlink", "bouquet.superlink")


def pid_alive(pid: int, name: str | tuple[str, ...]) -> bool:
    """Whether ``pid`` runs a command whose line contains ``name`` (or one of them; a PID reused by another
    program is not)."""
    if pid <= 0:  # 0 and negative numbers name process groups, never one process
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    status = Path(f"/proc/{pid}/stat")
    if status.is_file() and status.read_text().rsplit(")", 1)[1].split()[0] == "Z":
        return False  # a zombie: exited, waiting for its parent
    if not Path("/proc").is_dir():
        return True
    line = command_line(pid)
    return any(one in line for one in ((name,) if isinstance(name, str) else name))


def _signal(pid: int, signum: int) -> None:
    """``signum`` to the process group ``pid`` leads, or to ``pid`` alone when it leads none."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        pass


def stop_pid(pid: int, name: str | tuple[str, ...], grace: float = 20) -> bool:
    """Stop ``pid`` and the process group it leads (we start every process in its own session) if ``pid`` still
    runs ``name``: SIGTERM, then SIGKILL after ``grace`` seconds.  Returns whether it was running."""
    if not pid_alive(pid, name):
        return False
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pid_alive(pid, name) and time.monotonic() < deadline:
        time.sleep(0.2)
    if pid_alive(pid, name):
        _signal(pid, signal.SIGKILL)
    return True


class RayHead:
    """A ``ray start --head --block`` process on 127.0.0.1, its session files under a short temporary folder.

    No dashboard and no usage stats.  ``num_cpus`` is what Ray hands out to ClientApp actors.  With
    ``loopback`` (the default) every Ray service binds 127.0.0.1 (:data:`bouquet.processes.LOOPBACK_RAY`) and no
    other node can join; ``loopback=False`` is the head of a multi-node cluster, whose services Ray 2.55 binds
    on all interfaces (docs/DEPLOY.md, "Scale-out", for the firewall).

    A loopback head lets the OS pick each worker's and driver's port (``--min-worker-port 0``).  ``ray start``
    otherwise hands them out from 10002-19999 on its own, so two heads on one machine (two test workers, two
    study drivers) hand out the same port, and the process that binds second dies at once (Ray's check
    "Failed to start the grpc server", exit 1): a ``flwr-simulation`` process that died so was failed by
    Flower 60 s later as "No heartbeat received from the task" (docs/RELIABILITY.md).  A multi-node head
    keeps Ray's range, which a firewall can allow.
    """

    def __init__(self, log: Path, num_cpus: int | None = None, startup_seconds: float = 120,
                 loopback: bool = True) -> None:
        self.port = free_port()
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # Ray's socket paths must stay short
        command = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", "--node-ip-address",
                   "127.0.0.1", "--port", str(self.port), "--num-cpus", str(num_cpus or os.cpu_count() or 1),
                   "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", str(self.temp_dir)]
        if loopback:
            command += ["--min-worker-port", "0", "--max-worker-port", "0"]
        self.process = start(command, Path(log), {**os.environ, **(LOOPBACK_RAY if loopback else {})})
        try:
            wait_until(lambda: bool(list(self.temp_dir.glob("session_*/logs/raylet.out"))), self.process, Path(log),
                       startup_seconds, f"ray head on 127.0.0.1:{self.port}")
            wait_until(lambda: port_open(self.port), self.process, Path(log), startup_seconds,
                       f"ray GCS on 127.0.0.1:{self.port}")
        except BaseException:
            self.stop()
            raise
        time.sleep(1)  # the GCS accepts drivers a moment after it listens

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_pid(self.process.pid, "ray")
        self.process.poll()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@dataclass(frozen=True)
class RuntimeState:
    """What ``runtime.json`` records of a warm runtime."""

    superlink_pid: int
    superlink_port: int
    flwr_home: str
    ray_pid: int
    ray_port: int
    ray_temp_dir: str
    started: float

    @property
    def ray_address(self) -> str:
        return f"127.0.0.1:{self.ray_port}"

    def problems(self) -> list[str]:
        """Why this runtime cannot take runs (empty when both processes run and listen)."""
        found = []
        if not pid_alive(self.superlink_pid, SUPERLINK_COMMANDS):
            found.append(f"its SuperLink (pid {self.superlink_pid}) is gone")
        elif not port_open(self.superlink_port):
            found.append(f"its SuperLink (pid {self.superlink_pid}) does not listen on 127.0.0.1:{self.superlink_port}")
        if not pid_alive(self.ray_pid, "ray"):
            found.append(f"its Ray head (pid {self.ray_pid}) is gone")
        elif not port_open(self.ray_port):
            found.append(f"its Ray head (pid {self.ray_pid}) does not listen on {self.ray_address}")
        return found


class WarmRuntime:
    """The warm runtime kept in ``folder`` (see the module docstring): :meth:`up`, :meth:`down`, :meth:`state`."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = Path(folder) if folder is not None else default_runtime_dir()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold ``runtime.lock`` (an exclusive ``flock``): one process at a time starts, stops or reads the runtime."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "runtime.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def state(self) -> RuntimeState | None:
        """The recorded runtime, healthy or not; None when none is recorded (or the record is unreadable)."""
        path = self.folder / STATE_FILE
        try:
            return RuntimeState(**json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as exc:
            raise RuntimeError(f"{path} is not a bouquet runtime record ({exc}); remove it, or run "
                               f"`python -m bouquet.launch --down`") from None

    def healthy(self) -> RuntimeState | None:
        """The recorded runtime if both its processes run and listen, else None."""
        with self.locked():
            state = self._readable_state()
            return state if state is not None and not state.problems() else None

    def _readable_state(self) -> RuntimeState | None:
        try:
            return self.state()
        except RuntimeError:
            return None

    def up(self, num_cpus: int | None = None, startup_seconds: float = 120,
           state_database: bool = False) -> tuple[RuntimeState, str]:
        """Start the runtime unless a healthy one runs; returns its state and a line saying what happened.

        A stale one (a process gone) is cleaned away first, and the line says why.  The SuperLink keeps its
        state in memory unless ``state_database`` (see :func:`bouquet.local_link.start_superlink`).
        """
        with self.locked():
            state = self._readable_state()
            note = ""
            if state is not None:
                problems = state.problems()
                if not problems:
                    return state, "already up"
                self._stop(state)
                note = f"replaced a stale runtime ({'; '.join(problems)}); "
            elif (self.folder / STATE_FILE).exists():
                (self.folder / STATE_FILE).unlink()
                note = "replaced an unreadable runtime record; "
            ray = RayHead(self.folder / "ray-head.log", num_cpus=num_cpus, startup_seconds=startup_seconds)
            try:
                link = start_superlink(self.folder / "superlink", env={"RAY_ADDRESS": ray.address},
                                       startup_seconds=startup_seconds, state_database=state_database)
            except BaseException:
                ray.stop()
                raise
            state = RuntimeState(superlink_pid=link.process.pid, superlink_port=link.port,
                                 flwr_home=str(link.flwr_home), ray_pid=ray.process.pid, ray_port=ray.port,
                                 ray_temp_dir=str(ray.temp_dir), started=time.time())
            (self.folder / STATE_FILE).write_text(json.dumps(asdict(state), indent=1) + "\n")
            return state, note + "started"

    def down(self) -> str:
        """Stop the runtime's processes by PID and remove its record; a line saying what was done."""
        with self.locked():
            state = self._readable_state()
            if state is None:
                if (self.folder / STATE_FILE).exists():
                    (self.folder / STATE_FILE).unlink()
                    return f"removed an unreadable runtime record in {self.folder}"
                return f"no warm runtime is running (nothing recorded in {self.folder})"
            stopped = self._stop(state)
            return (f"stopped {', '.join(stopped)}" if stopped else
                    "the recorded runtime had already stopped; its record is removed")

    def _stop(self, state: RuntimeState) -> list[str]:
        stopped = []
        from bouquet.processes import descendants

        # the SuperLink starts flower-superexec and the simulations in sessions of their own: stop them by PID too
        below = descendants(state.superlink_pid) if pid_alive(state.superlink_pid, SUPERLINK_COMMANDS) else []
        if stop_pid(state.superlink_pid, SUPERLINK_COMMANDS):
            stopped.append(f"SuperLink (pid {state.superlink_pid})")
        for pid in below:
            stop_pid(pid, "", grace=10)
        if stop_pid(state.ray_pid, "ray"):
            stopped.append(f"Ray head (pid {state.ray_pid})")
        shutil.rmtree(state.ray_temp_dir, ignore_errors=True)
        (self.folder / STATE_FILE).unlink(missing_ok=True)
        return stopped

    def describe(self) -> str:
        """Status lines for ``--status``."""
        with self.locked():
            try:
                state = self.state()
            except RuntimeError as exc:
                return str(exc)
            if state is None:
                return f"no warm runtime (folder {self.folder}); start one with `python -m bouquet.launch --up`"
            problems = state.problems()
            age = time.time() - state.started
            lines = [f"warm runtime in {self.folder}: " + ("up" if not problems else "stale: " + "; ".join(problems)),
                     (f"  SuperLink pid {state.superlink_pid} on 127.0.0.1:{state.superlink_port} "
                      f"(FLWR_HOME {state.flwr_home})"),
                     f"  Ray head pid {state.ray_pid} on {state.ray_address} (session files {state.ray_temp_dir})",
                     f"  up for {age / 60:.1f} min"]
            if problems:
                lines.append("  `python -m bouquet.launch --up` replaces it; `--down` stops what is left of it")
            return "\n".join(lines)
