"""The private SuperLink is stopped however its owner ends, SIGTERM included."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

OWNER = """
import sys, time
from pathlib import Path
from bouquet.launch import local_superlink
with local_superlink(Path(sys.argv[1])) as link:
    print(link.process.pid, flush=True)
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited; it only waits to be reaped
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_sigterm_to_the_owner_stops_its_superlink(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             cwd=ROOT)
    try:
        superlink = int(owner.stdout.readline())
        assert _alive(superlink)
        owner.send_signal(signal.SIGTERM)
        assert owner.wait(timeout=60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while _alive(superlink) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(superlink)
    finally:
        if owner.poll() is None:
            owner.kill()


def test_resume_reuses_the_folders_config_and_adds_resume_from(tmp_path):
    import json

    import pytest

    from bouquet.config import AppConfig
    from bouquet.launch import format_overrides, parse_overrides, resume_overrides

    config = AppConfig.from_run_config({"hk-tau": 0.5, "run-name": "long", "data-path": "/x y/z.zip"}).to_run_config()
    assert parse_overrides(format_overrides(config)) == config  # every key survives the trip through the CLI
    (tmp_path / "config.json").write_text(json.dumps(config))
    resumed = parse_overrides(resume_overrides(tmp_path, "resume-allow-rounds=true num-server-rounds=30"))
    assert resumed == {**config, "resume-from": str(tmp_path.resolve()), "resume-allow-rounds": True,
                       "num-server-rounds": 30}
    with pytest.raises(SystemExit, match="no config.json"):
        resume_overrides(tmp_path / "absent")
    with pytest.raises(ValueError, match="double quote"):
        format_overrides({"run-name": 'a"b'})


def test_a_named_preset_goes_to_flwr_as_its_file_under_the_keys_given(tmp_path):
    """Flower takes one TOML file or key-value strings: the preset's file and the keys given become one file,
    and a key given wins whatever its value; a run config that names no preset goes as it is."""
    import tomllib

    from bouquet.config import FORECASTERS
    from bouquet.launch import preset_applied

    assert preset_applied("num-server-rounds=3", tmp_path) == "num-server-rounds=3"
    written = tomllib.loads(Path(preset_applied('forecaster="paper" learning-rate=0.01', tmp_path)).read_text())
    assert written == {**FORECASTERS["paper"], "forecaster": "paper", "learning-rate": 0.01}
    layers = tmp_path / "job.run-config.toml"  # what a study writes
    layers.write_text('forecaster = "improved"\nforecast-loss = "mse"\nseed = 2\n')
    (tmp_path / "out").mkdir()
    written = tomllib.loads(Path(preset_applied(str(layers), tmp_path / "out")).read_text())
    assert written == {**FORECASTERS["improved"], "forecaster": "improved", "forecast-loss": "mse", "seed": 2}


def test_failed_runs_name_every_run_that_did_not_complete():
    from bouquet.launch import failed_runs

    listing = ('{"success": true, "runs": [{"run-id": "1", "status": "finished:completed", "status-details": ""},'
               ' {"run-id": "2", "status": "finished:failed", "status-details": "No heartbeat received from the task"},'
               ' {"run-id": "3", "status": "running", "status-details": ""}]}')
    assert failed_runs(listing) == ["run 2 ended finished:failed: No heartbeat received from the task",
                                    "run 3 ended running"]
    assert failed_runs('{"runs": []}') == []
    assert failed_runs("flwr ls failed: connection refused")[0].startswith("could not read the runs' status")


def test_a_ray_address_nobody_answers_at_stops_before_any_run_starts(tmp_path, capsys):
    import socket

    import pytest

    from bouquet import launch
    from bouquet.experiments import run_jobs
    from bouquet.processes import check_ray_address, free_port

    port = free_port()  # nothing listens there
    with pytest.raises(SystemExit) as stopped:
        launch.main([str(ROOT), "--supernodes", "2", "--ray-address", f"127.0.0.1:{port}"])
    assert stopped.value.code == 2
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not host:port"):
        check_ray_address("head-without-port")
    with pytest.raises(ValueError, match="no Ray cluster answers"):
        run_jobs(ROOT, [], tmp_path, str, ray_address=f"ray://127.0.0.1:{port}")
    with socket.socket() as listening:  # something answers: accepted (Ray itself then does the rest)
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_ray_address(f"127.0.0.1:{listening.getsockname()[1]}")
    check_ray_address("auto")


def test_app_files_skip_ignored_folders_symlinks_and_git_but_keep_the_rest(tmp_path):
    from bouquet.launch import app_files

    (tmp_path / ".gitignore").write_text("results/\n*.log\n!keep.log\n")
    for path in ["pyproject.toml", "pkg/mod.py", "pkg/sub/data.toml", "run.log", "keep.log",
                 "results/r1/summary.json", ".venv/lib/x.py", ".git/HEAD", "pkg/__pycache__/mod.pyc"]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    (tmp_path / "link.py").symlink_to(tmp_path / "pkg" / "mod.py")
    (tmp_path / "linked").symlink_to(tmp_path / "pkg", target_is_directory=True)
    assert app_files(tmp_path) == [".gitignore", "keep.log", "pkg/mod.py", "pkg/sub/data.toml", "pyproject.toml"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # importing flwr.cli: typer on click 8.3
def test_the_staged_app_builds_the_same_fab_as_the_repository(tmp_path):
    """What `flwr run` gets from staged_app is this repository's FAB to the byte.

    Built with the function `flwr run` itself calls (Flower 1.42's ``build_fab_from_disk``), because the
    `flwr build` command also insists on a valid folder name, and a CI clone's folder is ``tmp.XXXX``.
    The stage's own name passes that check too (`flwr build` on it is tested here).
    """
    from flwr.cli.build import build_fab_from_disk

    from bouquet.launch import staged_app
    from bouquet.processes import flower_bin

    with staged_app(ROOT) as staged:
        assert len(list(staged.rglob("*"))) < 1000
        from_stage = build_fab_from_disk(staged)
        (tmp_path / "out").mkdir()
        done = subprocess.run([flower_bin("flwr"), "build", "--app", str(staged)], cwd=tmp_path / "out",
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        (fab,) = (tmp_path / "out").glob("*.fab")
        assert fab.read_bytes() == from_stage
    assert from_stage == build_fab_from_disk(ROOT)


def test_unfinished_runs_are_new_folders_with_a_checkpoint_and_no_summary(tmp_path):
    from bouquet.launch import app_config, unfinished_runs

    def folder(name, checkpoint=True, summary=False):
        path = tmp_path / name
        (path / "checkpoints").mkdir(parents=True)
        (path / "config.json").write_text("{}")
        if checkpoint:
            (path / "checkpoints" / "round-0001.npz").write_bytes(b"")
        if summary:
            (path / "summary.json").write_text("{}")
        return path

    old = folder("a-old")
    wanted = [folder("b-stopped"), folder("c-stopped")]
    folder("d-finished", summary=True)
    folder("e-no-checkpoint", checkpoint=False)
    (tmp_path / "f-not-a-run").mkdir()
    assert unfinished_runs(tmp_path, before={old}) == wanted
    assert unfinished_runs(tmp_path / "absent", before=set()) == []
    assert app_config(ROOT, 'results-dir="/x/y" seed=3').run.results_dir == "/x/y"


@pytest.mark.tier2  # second tier: resume to the same numbers is first-tier (test_e2e_resume.py)
@pytest.mark.e2e
def test_a_run_that_loses_its_simulation_process_ends_with_the_resume_command_that_finishes_it(tmp_path):
    """``python -m bouquet.launch`` whose ``flwr-simulation`` process is SIGKILLed after round 1 reports Flower's
    failed status and prints the ``--resume`` command; that command finishes the run in the same folder."""
    import re

    from bouquet.processes import command_line, descendants
    from tests.waiting import wait_for_checkpoint

    results = tmp_path / "results"
    config = (f'results-dir="{results}" run-name="stopped" num-server-rounds=3 clients-per-round=2 '
              'synthetic-households=4 active-factor=0 local-epochs=1')
    command = [sys.executable, "-m", "bouquet.launch", str(ROOT), "--supernodes", "4", "--run-config", config]
    with open(tmp_path / "launch.log", "w") as log:
        launch = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        try:
            class Alive:  # wait_for_checkpoint's runner: the launch process
                is_alive = staticmethod(lambda: launch.poll() is None)

            wait_for_checkpoint(results / "stopped", 1, Alive, detail=lambda: (tmp_path / "launch.log").read_text())
            victims = [pid for pid in descendants(launch.pid) if "flwr-simulation" in command_line(pid)]
            assert victims, "no flwr-simulation process under the launcher"
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            code = launch.wait(timeout=300)
        finally:
            if launch.poll() is None:
                launch.kill()
    output = (tmp_path / "launch.log").read_text()
    assert code == 1, output
    assert re.search(r"bouquet: run \d+ ended finished:failed", output), output
    resume = f"python -m bouquet.launch {ROOT} --resume {results / 'stopped'}"
    assert resume in output, output
    assert not (results / "stopped" / "summary.json").exists()
    done = subprocess.run([sys.executable, *resume.split()[1:]], check=False, capture_output=True, text=True,
                          cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "bouquet: resuming" in done.stdout
    summary = (results / "stopped" / "summary.json")
    assert summary.exists(), done.stdout[-3000:]


def test_federation_config_gives_gpus_only_when_asked_and_refuses_nonsense():
    from bouquet.launch import federation_config, main

    assert federation_config(10) == "num-supernodes=10 client-resources-num-cpus=1"
    assert federation_config(4, 2, 0.5) == "num-supernodes=4 client-resources-num-cpus=2 client-resources-num-gpus=0.5"
    for bad in ((0, 1, 0), (4, 0, 0), (4, 1, -1)):
        with pytest.raises(ValueError, match="SuperNode|cpus-per-client"):
            federation_config(*bad)
    with pytest.raises(SystemExit) as stopped:
        main([str(ROOT), "--supernodes", "2", "--gpus-per-client", "-1"])
    assert stopped.value.code == 2


def test_flowers_heartbeat_thread_ends_at_the_first_http_500_which_is_why_local_superlinks_keep_state_in_memory():
    """The cause of "No heartbeat received from the task" (docs/RELIABILITY.md), pinned on Flower's own code: its
    heartbeat function re-raises an HTTP error other than 503/504, and the sender's thread then ends for good.  A
    SuperLink with SQLite state answers 500 when a write waits past SQLite's busy timeout, so bouquet's local
    SuperLinks keep their state in memory.  If a Flower release retries a 500, this test fails: revisit."""
    import threading
    import time

    import httpx
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http

    calls = []

    class Stub:
        def SendTaskHeartbeat(self, request):
            calls.append(time.monotonic())
            request = httpx.Request("POST", "http://127.0.0.1/v1/runtime/send-task-heartbeat")
            raise httpx.HTTPStatusError("500", request=request, response=httpx.Response(500, request=request))

    died = []
    previous = threading.excepthook
    threading.excepthook = lambda hook: died.append(hook.exc_type)
    try:
        sender = HeartbeatSender(make_task_heartbeat_fn_http(Stub()))
        sender.start()
        deadline = time.monotonic() + 10
        while sender.is_running and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        threading.excepthook = previous
    assert len(calls) == 1 and not sender.is_running and died == [httpx.HTTPStatusError]


def test_local_superlinks_keep_their_state_in_memory_unless_asked(tmp_path, monkeypatch):
    from bouquet import launch, local_link

    commands = []

    def fake_start(command, log, env):
        commands.append(command)
        raise RuntimeError("not started in this test")

    monkeypatch.setattr(local_link, "start", fake_start)
    for database in (False, True):
        with pytest.raises(RuntimeError, match="not started"):
            launch.start_superlink(tmp_path / str(database), state_database=database)
    assert "--database" not in commands[0]
    assert commands[1][commands[1].index("--database") + 1] == str(tmp_path / "True" / "state.db")
