"""The warm runtime (bouquet.runtime, ``python -m bouquet.launch --up / --status / --down``): real processes."""

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

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
        assert pid_alive(child.pid, "sleep") and not pid_alive(child.pid, "flower-superlink")
        assert not stop_pid(child.pid, "flower-superlink")  # a PID reused by another program is left alone
        assert child.poll() is None
        assert stop_pid(child.pid, "sleep", grace=5)
        child.wait(timeout=10)
        assert not pid_alive(child.pid, "sleep") and not stop_pid(child.pid, "sleep")
    finally:
        child.kill()


RUN = 'forecaster="paper" num-server-rounds=2 clients-per-round=4 seed=3'


def _run(runtime_dir: Path, results: Path, name: str, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    done = launch(".", "--supernodes", "4", "--runtime-dir", str(runtime_dir), *extra,
                  "--run-config", f'{RUN} results-dir="{results}" run-name="{name}"')
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, RunFolder(results / name).summary()


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

        warm, warm_summary = _run(runtime_dir, tmp_path / "results", "warm")
        assert f"joining the warm runtime: SuperLink 127.0.0.1:{state['superlink_port']}" in warm.stdout
        cold, cold_summary = _run(runtime_dir, tmp_path / "results", "cold", "--cold")
        assert "private SuperLink" in cold.stdout and "joining" not in cold.stdout
        for key in ("mae-litres-mean", "mae-litres-std", "mse-mean"):  # same seed, same numbers, warm or cold
            assert warm_summary[key] == cold_summary[key], key

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
