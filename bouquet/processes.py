"""Starting, waiting for and stopping the Flower processes bouquet runs (SuperLink, SuperNodes, ``flwr``).

One module for :mod:`bouquet.launch` (a private SuperLink for simulation) and :mod:`bouquet.deploy`
(SuperLink and SuperNodes with TLS): every process runs on 127.0.0.1 in its own session, writes to its
own log, and is stopped by PID (its whole process group), gently first.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LOOPBACK_RAY", "Listener", "check_ray_address", "flower_bin", "flwr", "free_port", "hold_write_lock",
           "listening_sockets", "loopback_ray_head", "offline_env", "port_open", "start", "stop", "terminate_as_exit", "wait_until"]

#: Environment that keeps a Ray started on (or joining) this machine on 127.0.0.1.  Ray 2.55 turns
#: ``--node-ip-address 127.0.0.1`` into the machine's own address, and its gRPC servers (GCS, raylet, every
#: worker) then listen on all interfaces; with Ray's multi-node mode off it takes 127.0.0.1 as the node's
#: address and binds every service there (what Ray does by default on macOS and Windows).  A second Ray node
#: cannot join such a head: multi-node Ray is an explicit opt-in (docs/DEPLOY.md, "Scale-out").
LOOPBACK_RAY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port``."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def check_ray_address(address: str, timeout: float = 5.0) -> None:
    """Raise ValueError, naming the address and the fix, unless a Ray head answers at ``address``.

    ``address`` is what ``ray start --head --port P`` prints for other nodes (``host:P``), or a Ray Client
    address ``ray://host:port``; ``auto`` is left to Ray.  Without this check a simulation given a wrong
    address starts, its nodes never come up, and the ServerApp waits for them until its own timeouts.
    """
    if address == "auto":
        return
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"Ray address {address!r} is not host:port (what `ray start --head --port P` prints)")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return
    except OSError as exc:
        raise ValueError(f"no Ray cluster answers at {address} ({exc.strerror or exc}); start one with "
                         f"`ray start --head --node-ip-address {host} --port {port}`, or leave out the Ray "
                         f"address to use a private Ray") from None


def offline_env(flwr_home: Path | None = None) -> dict[str, str]:
    """Environment for Flower commands: no telemetry, no per-run dependency install."""
    env = dict(os.environ)
    env.update(FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    # Flower starts helper processes (flower-superexec, ...) by name: put this interpreter's bin first
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    if flwr_home is not None:
        env["FLWR_HOME"] = str(flwr_home)
    return env


def flower_bin(name: str) -> str:
    """The path of a Flower command (``flwr``, ``flower-superlink``, ...) of this Python environment."""
    candidate = Path(sys.executable).with_name(name)
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found next to {sys.executable} or on PATH; pip install 'flwr[simulation]'")
    return found


def hold_write_lock(database: Path, seconds: float, started: threading.Event | None = None) -> None:
    """Hold the write lock of the SQLite ``database`` for ``seconds`` (as a long write, a backup or a slow disk
    does): every other writer waits for it, up to its own busy timeout.  ``started`` is set once it is held."""
    import sqlite3

    connection = sqlite3.connect(database, isolation_level=None, timeout=60)
    try:
        connection.execute("BEGIN IMMEDIATE")
        if started is not None:
            started.set()
        time.sleep(seconds)
        connection.execute("ROLLBACK")
    finally:
        connection.close()


def start(command: list[str], log: Path, env: dict[str, str], append: bool = False) -> subprocess.Popen:
    """Start ``command`` in its own session with stdout and stderr in ``log``."""
    with open(log, "a" if append else "w") as handle:  # the child keeps its own copy
        return subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)


def descendants(root: int) -> list[int]:
    """PIDs of every process below ``root`` (children, grandchildren, ...), read from Linux ``/proc``.

    Flower's SuperLink starts ``flower-superexec`` and it the ServerApp / simulation process, each detached
    into its own session, so a process group does not reach them; their parent PIDs do.  Empty where there is
    no ``/proc``.
    """
    parents: dict[int, int] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    below: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - below
        below |= frontier
    return sorted(below)


@dataclass(frozen=True)
class Listener:
    """A TCP socket that a process listens on."""

    pid: int
    command: str
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        """Whether only this machine can connect (127.0.0.0/8, ``::1``, or IPv4-mapped 127.x)."""
        address = ipaddress.ip_address(self.address)
        mapped = getattr(address, "ipv4_mapped", None)
        return (mapped or address).is_loopback


def _socket_address(hex_address: str) -> tuple[str, int]:
    """``/proc/net/tcp{,6}``'s ``ADDR:PORT`` (hexadecimal, the address in host byte order per 32-bit word)."""
    address, port = hex_address.split(":")
    raw = bytes.fromhex(address)
    ip = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))
    mapped = getattr(ip, "ipv4_mapped", None)
    return (f"::ffff:{mapped}" if mapped else str(ip)), int(port, 16)


def listening_sockets(pids: list[int]) -> list[Listener]:
    """The TCP sockets in LISTEN state that the processes ``pids`` hold, read from Linux ``/proc``.

    A socket is matched to a process by its inode (``/proc/PID/fd`` links ``socket:[INODE]``); a process
    that is gone or not ours to read is passed over.  Empty where there is no ``/proc``.
    """
    listeners: list[Listener] = []
    for pid in pids:
        folder = Path("/proc") / str(pid)
        inodes = set()
        try:
            descriptors = list((folder / "fd").iterdir())
        except OSError:
            continue
        for descriptor in descriptors:
            try:
                target = os.readlink(descriptor)
            except OSError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        listeners += [Listener(pid, command_line(pid), address, port)
                      for inode, address, port in _listen_rows() if inode in inodes]
    return listeners


def _listen_rows() -> Iterator[tuple[str, str, int]]:
    """``(inode, address, port)`` of every TCP socket in LISTEN state this process can see in ``/proc/net``."""
    for table in ("tcp", "tcp6"):
        try:
            rows = (Path("/proc/net") / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A":  # 0A: TCP_LISTEN
                address, port = _socket_address(fields[1])
                yield fields[9], address, port


def loopback_ray_head(address: str) -> bool:
    """Whether the Ray head at ``address`` (``host:port``) runs on this machine in loopback mode.

    A head started with :data:`LOOPBACK_RAY` binds its GCS port on 127.0.0.1 only; a process joining it (a
    simulation's driver) needs the same environment, or Ray looks for the head's node under the machine's own
    address and never finds it.  A multi-node head binds its GCS port on all interfaces (``0.0.0.0`` / ``::``),
    and a head on another host is multi-node by definition: both are False.  False where there is no ``/proc``.
    """
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1", "[::1]") or not port.isdigit():
        return False
    bound = [Listener(0, "", where, int(port)) for _, where, at in _listen_rows() if at == int(port)]
    return bool(bound) and all(listener.loopback for listener in bound)


def command_line(pid: int) -> str:
    """The command line of ``pid`` (empty if it is gone or unreadable)."""
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stop(process: subprocess.Popen, grace: float = 20) -> None:
    """Stop ``process`` and its process group: SIGTERM, then SIGKILL after ``grace`` seconds."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def wait_until(ready: Callable[[], bool], process: subprocess.Popen, log: Path, timeout: float, what: str,
               interval: float = 0.3) -> None:
    """Poll ``ready()`` until it holds; a clear error if ``process`` exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{log.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready within {timeout:g} s (log: {log})")
        time.sleep(interval)


def flwr(args: list[str], flwr_home: Path, timeout: float | None = 600,
         capture: bool = True) -> subprocess.CompletedProcess:
    """``flwr <args>`` with ``FLWR_HOME`` = ``flwr_home`` (output captured, or streamed to this terminal)."""
    return subprocess.run([flower_bin("flwr"), *args], env=offline_env(flwr_home), capture_output=capture, text=True,
                          check=False, timeout=timeout)


@contextmanager
def terminate_as_exit() -> Iterator[None]:
    """In the main thread, turn SIGTERM into ``SystemExit`` so that ``finally`` blocks stop what we started.

    Python's default SIGTERM action ends the process at once: a SuperLink started in its own session
    (and the simulation under it) would be left running when a runner is killed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
