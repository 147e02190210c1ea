"""Shared fixtures: an isolated data cache, the shared real data, and one Ray head + SuperLink per session.

End-to-end tests run real ``flwr run`` commands against a real ``flower-superlink`` (simulation
runtime).  Starting a SuperLink and a Ray cluster costs ~5-9 s per run, so a test session (each pytest-xdist
worker is one) starts bouquet's warm runtime (:mod:`bouquet.runtime`: one Ray head and one SuperLink on
127.0.0.1) that every simulation joins (``RAY_ADDRESS``): each ``flwr run`` is still its own run with its own
simulation process, ServerApp and ClientApp actors, and its own results folder, so tests stay independent.
Both processes are stopped by PID at the end of the session.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
DAIAD_ZIP = SHARED_DATA / "daiad" / "swm_trialA.zip"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("BOUQUET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture
def daiad_zip() -> Path:
    if not DAIAD_ZIP.exists():
        pytest.skip(f"real DAIAD file not found at {DAIAD_ZIP} (shared data is only on developer/CI machines)")
    return DAIAD_ZIP


class RayNode:
    """A second Ray node: ``ray start --address <head> --block`` on 127.0.0.1 with its own CPUs.

    It shares the head's session folder (one machine) but runs its own raylet, which starts the worker
    processes of the actors Ray places on this node.
    """

    def __init__(self, head, log: Path, num_cpus: int = 1) -> None:
        with open(log, "w") as handle:
            self.process = subprocess.Popen(
                [str(Path(sys.executable).with_name("ray")), "start", "--address", head.address, "--block",
                 "--node-ip-address", "127.0.0.1", "--num-cpus", str(num_cpus), "--disable-usage-stats"],
                stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while not self.raylet_pid():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray node did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        time.sleep(2)

    def raylet_pid(self) -> int | None:
        return raylet_of(self.process.pid)

    def stop(self) -> None:
        stop_group(self.process)


def raylet_of(ray_start_pid: int) -> int | None:
    """The PID of the raylet that the ``ray start`` process ``ray_start_pid`` runs, if it runs one yet."""
    from bouquet.processes import command_line, descendants

    raylets = [pid for pid in descendants(ray_start_pid) if command_line(pid).split(" ")[0].endswith("/raylet")]
    return raylets[0] if raylets else None


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM the process group we started (SIGKILL after 30 s)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def runtime_cpus() -> int:
    """CPUs of each session's Ray head: the machine's cores shared among the pytest-xdist workers (each starts
    its own runtime).  Two workers that each claimed every core ran twice as many ClientApps as there are cores;
    on a loaded machine a simulation process starved that way missed Flower's 60 s task deadline ("No
    heartbeat received from the task", docs/RELIABILITY.md, "Tests that failed sometimes")."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (os.cpu_count() or 2) // workers)


@pytest.fixture(scope="session")
def warm_runtime(tmp_path_factory):
    """The session's warm runtime (:class:`bouquet.runtime.WarmRuntime`): one Ray head and one SuperLink on
    127.0.0.1 that every simulation of the session joins, stopped at the end (and checked stopped)."""
    from bouquet.runtime import WarmRuntime, pid_alive

    runtime = WarmRuntime(tmp_path_factory.mktemp("runtime"))
    state, _ = runtime.up(num_cpus=runtime_cpus())
    try:
        yield state
    finally:
        runtime.down()
        assert not pid_alive(state.superlink_pid, "flower-superlink") and not pid_alive(state.ray_pid, "ray")


@pytest.fixture(scope="session")
def ray_head(warm_runtime):
    """The session's Ray head: its ``address``, ``port``, session folder ``temp_dir`` and whether it ``alive()``."""
    from bouquet.runtime import pid_alive

    return SimpleNamespace(address=warm_runtime.ray_address, port=warm_runtime.ray_port,
                           temp_dir=Path(warm_runtime.ray_temp_dir),
                           alive=lambda: pid_alive(warm_runtime.ray_pid, "ray"))


@pytest.fixture(scope="session")
def superlink(warm_runtime):
    """The session's SuperLink (simulation runtime), whose simulations join the session's Ray head."""
    from bouquet.launch import LocalSuperLink

    return LocalSuperLink(None, warm_runtime.superlink_port, Path(warm_runtime.flwr_home))


@pytest.fixture
def run_app(tmp_path, superlink):
    """``run_app(run_config, supernodes=4)``: one real ``flwr run`` of this app; returns (run folder, stdout).

    The run config names the paper's forecaster unless it names one: the tests and pins written for the paper's
    setting keep it now that the app's default job (pyproject.toml) is the personal preset.  ``flwr_run``
    applies the named preset's file under the keys given (bouquet.launch.preset_applied)."""

    def run(run_config: str, supernodes: int = 4, check: bool = True):
        if "forecaster=" not in run_config.replace(" = ", "="):
            run_config = f'forecaster="paper" {run_config}'
        results = tmp_path / "results"
        # one try: a run Flower fails (e.g. "No heartbeat received from the task") fails the test
        done = superlink.flwr_run(ROOT, run_config=f'{run_config} results-dir="{results}" run-name="e2e"',
                                  federation_config=f"num-supernodes={supernodes} client-resources-num-cpus=1")
        if check:  # flwr run --stream exits 0 even when the ServerApp raised: the summary is the proof
            assert done.returncode == 0 and (results / "e2e" / "summary.json").exists(), \
                done.stdout[-4000:] + done.stderr[-4000:] + "\nSuperLink runs: " + superlink.run_statuses()
        output = done.stdout + done.stderr
        started = re.search(r"Successfully started run (\d+)", done.stdout)
        if not check and started:  # a run that fails at once can end before its stream shows the error
            output += superlink.run_log(int(started.group(1)))
        return results / "e2e", output

    return run
