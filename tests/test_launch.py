"""The private SuperLink is stopped however its owner ends, SIGTERM included."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def test_failed_runs_name_every_run_that_did_not_complete():
    from bouquet.launch import failed_runs

    listing = ('{"success": true, "runs": [{"run-id": "1", "status": "finished:completed", "status-details": ""},'
               ' {"run-id": "2", "status": "finished:failed", "status-details": "No heartbeat received from the task"},'
               ' {"run-id": "3", "status": "running", "status-details": ""}]}')
    assert failed_runs(listing) == ["run 2 ended finished:failed: No heartbeat received from the task",
                                    "run 3 ended running"]
    assert failed_runs('{"runs": []}') == []
    assert failed_runs("flwr ls failed: connection refused")[0].startswith("could not read the runs' status")
