"""The warm runtime (bouquet.runtime, ``python -m bouquet.launch --up / --status / --down``): real processes."""

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bouquet.processes import Listener, command_line, descendants, listening_sockets
from bouquet.results import RunFolder
from bouquet.runtime import WarmRuntime, pid_alive, stop_pid

ROOT = Path(__file__).resolve().parents[1]


def launch(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bouquet.launch", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, cwd=ROOT)


def test_down_and_status_when_nothing_runs_say_so_and_exit_0(tmp_path):
    done = launch("--down", "--runtime-dir", str(tmp_path / "rt"))
    assert done.returncode == 0 and "no warm runtime is running" in done.stdout
    done = launch("--status", "--runtime-dir", str(tmp_path / "rt"))
    assert done.returncode == 0 and "no warm runtime" in done.stdout and "--up" in done.stdout


def test_an_unreadable_record_is_named_and_down_removes_it(tmp_path):
    (tmp_path / "runtime.json").write_text("{not json")
    assert "is not a bouquet runtime record" in WarmRuntime(tmp_path).describe()
    assert "removed an unreadable runtime record" in WarmRuntime(tmp_path).down()
    assert not (tmp_path / "runtime.json").exists()


def test_stop_pid_stops_only_the_named_program_and_its_group(tmp_path):
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        # Popen returns once the child's execve has replaced its memory, which the kernel does before it writes
        # the new command line: under load /proc/<pid>/cmdline can read empty for a moment (seen in CI)
        deadline = time.monotonic() + 10
        while not command_line(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pid_alive(child.pid, "sleep") and not pid_alive(child.pid, "flower-superlink")
        assert not stop_pid(child.pid, "flower-superlink")  # a PID reused by another program is left alone
        assert child.poll() is None
        assert stop_pid(child.pid, "sleep", grace=5)
        child.wait(timeout=10)
        assert not pid_alive(child.pid, "sleep") and not stop_pid(child.pid, "sleep")
    finally:
        child.kill()


RUN = 'forecaster="paper" num-server-rounds=2 clients-per-round=4 seed=3'


def _run(runtime_dir: Path, results: Path, name: str, *extra: str,
         listeners: set[Listener] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """One ``python -m bouquet.launch`` run; ``listeners`` collects, every 0.2 s while it runs, the listening
    sockets of every process below it and below the warm runtime's SuperLink and Ray head (if one is up)."""
    command = [sys.executable, "-m", "bouquet.launch", ".", "--supernodes", "4", "--runtime-dir", str(runtime_dir),
               *extra, "--run-config", f'{RUN} results-dir="{results}" run-name="{name}"']
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    finished = threading.Event()

    def sample() -> None:
        record = runtime_dir / "runtime.json"
        while not finished.is_set():
            state = json.loads(record.read_text()) if record.exists() else {}
            roots = [process.pid, *(state.get(key, 0) for key in ("superlink_pid", "ray_pid"))]
            pids = {pid for root in roots if root > 0 for pid in [root, *descendants(root)]}
            listeners.update(listening_sockets(sorted(pids)))
            finished.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    if listeners is not None:
        sampler.start()
    try:
        stdout, stderr = process.communicate(timeout=600)
    finally:
        finished.set()
        process.kill()
    if listeners is not None:
        sampler.join()
    done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, RunFolder(results / name).summary()


def _programs(listeners: set[Listener]) -> set[str]:
    """Which kinds of process were seen listening."""
    kinds = ("gcs_server", "raylet", "ray::ClientAppActor", "flwr-simulation", "flower-superlink")
    return {kind for kind in kinds for listener in listeners if kind in listener.command}


@pytest.mark.e2e
def test_racing_ups_start_one_runtime_that_runs_join_with_cold_numbers_and_a_stale_one_restarts(tmp_path):
    runtime_dir = tmp_path / "rt"
    fresh = {"superlink_pid": -1, "ray_pid": -1}
    with ThreadPoolExecutor(2) as pool:  # two launches racing to start it: one runtime
        ups = list(pool.map(lambda _: launch("--up", "--runtime-dir", str(runtime_dir), "--num-cpus", "2"), range(2)))
    try:
        assert all(done.returncode == 0 for done in ups), [d.stdout + d.stderr for d in ups]
        whats = sorted(done.stdout.split("warm runtime ")[1].split(":")[0] for done in ups)
        assert whats == ["already up", "started"]
        state = json.loads((runtime_dir / "runtime.json").read_text())
        assert all(f"(pid {state['superlink_pid']})" in done.stdout for done in ups)
        status = launch("--status", "--runtime-dir", str(runtime_dir))
        assert f"warm runtime in {runtime_dir}: up" in status.stdout

        warm_listeners: set[Listener] = set()
        warm, warm_summary = _run(runtime_dir, tmp_path / "results", "warm", listeners=warm_listeners)
        assert f"joining the warm runtime: SuperLink 127.0.0.1:{state['superlink_port']}" in warm.stdout
        cold_listeners: set[Listener] = set()
        cold, cold_summary = _run(tmp_path / "no-runtime", tmp_path / "results", "cold", "--cold",
                                  listeners=cold_listeners)
        assert "private SuperLink" in cold.stdout and "joining" not in cold.stdout
        for key in ("mae-litres-mean", "mae-litres-std", "mse-mean"):  # same seed, same numbers, warm or cold
            assert warm_summary[key] == cold_summary[key], key
        # nothing a local run starts listens beyond loopback: the warm runtime's processes and a cold run's
        # (its SuperLink, and the private Ray its simulation starts), each seen while it runs
        for listeners in (warm_listeners, cold_listeners):
            assert _programs(listeners) == {"gcs_server", "raylet", "ray::ClientAppActor", "flwr-simulation",
                                            "flower-superlink"}, sorted(listeners, key=str)
            exposed = sorted(f"{item.address}:{item.port} {item.command[:60]}" for item in listeners
                             if not item.loopback)
            assert not exposed, exposed

        os.kill(state["superlink_pid"], 9)  # a stale runtime: its SuperLink killed
        deadline = time.monotonic() + 30
        while pid_alive(state["superlink_pid"], "flower-superlink") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "stale: its SuperLink" in launch("--status", "--runtime-dir", str(runtime_dir)).stdout
        again = launch("--up", "--runtime-dir", str(runtime_dir))  # what a run does first (run_superlink)
        assert again.returncode == 0 and "replaced a stale runtime (its SuperLink" in again.stdout, again.stdout
        assert not pid_alive(state["ray_pid"], "ray")  # the old Ray head was stopped, not orphaned
        fresh = json.loads((runtime_dir / "runtime.json").read_text())
        assert fresh["superlink_pid"] != state["superlink_pid"]
    finally:
        down = launch("--down", "--runtime-dir", str(runtime_dir))
    assert down.returncode == 0 and "stopped SuperLink" in down.stdout, down.stdout + down.stderr
    assert not pid_alive(fresh["superlink_pid"], "flower-superlink") and not pid_alive(fresh["ray_pid"], "ray")
    assert not (runtime_dir / "runtime.json").exists()


@pytest.mark.parametrize(("table_entry", "address", "port", "loopback"), [
    ("0100007F:1F90", "127.0.0.1", 8080, True),  # /proc/net/tcp: each 32-bit word in host (little-endian) order
    ("0101007F:0050", "127.0.1.1", 80, True),
    ("00000000:0050", "0.0.0.0", 80, False),
    ("020200C0:2711", "192.0.2.2", 10001, False),
    ("00000000000000000000000001000000:0016", "::1", 22, True),  # /proc/net/tcp6
    ("00000000000000000000000000000000:1F90", "::", 8080, False),
    ("0000000000000000FFFF00000100007F:2711", "::ffff:127.0.0.1", 10001, True),
    ("0000000000000000FFFF0000020200C0:2711", "::ffff:192.0.2.2", 10001, False),
])
def test_proc_net_addresses_are_read_and_classed_by_hand(table_entry, address, port, loopback):
    from bouquet.processes import _socket_address
    assert _socket_address(table_entry) == (address, port)
    assert Listener(1, "x", address, port).loopback is loopback


def test_listening_sockets_finds_this_process_listening_on_loopback_and_not_a_connected_socket():
    import socket
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client.connect(server.getsockname())
        found = [item for item in listening_sockets([os.getpid()]) if item.port == server.getsockname()[1]]
        assert [(item.address, item.loopback) for item in found] == [("127.0.0.1", True)]
        assert client.getsockname()[1] not in {item.port for item in listening_sockets([os.getpid()])}
    assert listening_sockets([2 ** 22 + 12345]) == []  # a PID that does not exist: passed over


def test_a_ray_head_is_loopback_only_when_its_port_listens_on_loopback_alone(ray_head):
    import socket

    from bouquet.processes import free_port, loopback_ray_head
    assert loopback_ray_head(ray_head.address)  # the session's head: started with LOOPBACK_RAY
    assert loopback_ray_head(f"ray://{ray_head.address}")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert loopback_ray_head(f"localhost:{server.getsockname()[1]}")
    assert not loopback_ray_head(f"127.0.0.1:{free_port()}")  # nothing listens there
    assert not loopback_ray_head("10.1.2.3:6379")  # another host: a multi-node cluster
    assert not loopback_ray_head("auto")


def test_a_runtime_with_a_state_database_runs_bouquets_superlink_and_is_seen_healthy_and_stopped(tmp_path):
    """``up(state_database=True)`` (what ``scripts/heartbeat_probe.py --state-database`` runs) starts
    ``python -m bouquet.superlink --database ...``: the runtime knows it as its SuperLink, healthy and stopped."""
    runtime = WarmRuntime(tmp_path / "rt")
    state, _ = runtime.up(num_cpus=1, state_database=True)
    try:
        line = command_line(state.superlink_pid)
        assert "bouquet.superlink" in line and "--state-busy-timeout" in line and "--database" in line
        assert runtime.healthy() is not None and pid_alive(state.superlink_pid, "bouquet.superlink")
    finally:
        runtime.down()
    assert not pid_alive(state.superlink_pid, ("flower-superlink", "bouquet.superlink"))
    assert not pid_alive(state.ray_pid, "ray")


def test_a_loopback_ray_heads_raylet_lets_the_os_pick_worker_and_driver_ports(warm_runtime):
    """Two heads on one machine (two test workers) handed out the same port from Ray's default 10002-19999,
    and a ``flwr-simulation`` driver that bound second died at once (docs/RELIABILITY.md): the raylet, which
    hands the ports out, must have been given 0 (the OS picks a free port)."""
    from bouquet.processes import command_line, descendants

    raylets = [command_line(pid) for pid in descendants(warm_runtime.ray_pid) if "raylet" in command_line(pid)]
    assert len(raylets) == 1
    assert "--min_worker_port=0" in raylets[0] and "--max_worker_port=0" in raylets[0]
