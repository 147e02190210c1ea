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
