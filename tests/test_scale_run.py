"""scripts/scale_run.py: what each process is, the tree below a process, and the memory sampler on a real one."""

import subprocess
import sys
import time

from bouquet.studies import scale_run as scale


def test_processes_are_grouped_by_their_command_line():
    assert scale.group_of("ray::ClientAppActor") == "clientapp-actors"
    assert scale.group_of("ray::IDLE") == "ray-daemons"
    assert scale.group_of("/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --x") == "ray-daemons"
    assert scale.group_of("/venv/bin/python /venv/bin/flower-superlink --insecure") == "superlink"
    assert scale.group_of("/venv/bin/python /venv/bin/flwr-simulation --app x") == "simulation"
    assert scale.group_of("/venv/bin/python -m bouquet.launch . --run-config x") == "launcher"


def test_memory_of_a_gone_process_is_zero():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert scale.memory_of(process.pid) == (0, 0)


def test_the_sampler_sees_a_child_that_holds_memory_and_its_peak():
    holder = "import time; block = bytearray(64 * 2**20); block[::4096] = b'x' * len(block[::4096]); time.sleep(3)"
    process = subprocess.Popen([sys.executable, "-c", holder])
    sampler = scale.MemorySampler(process.pid, interval=0.2)
    sampler.start()
    time.sleep(2)
    sampler.stopped.set()
    sampler.join()
    process.wait()
    report = sampler.report()
    assert report["launcher"]["processes"] == 1
    assert 64 <= report["launcher"]["largest_peak_mib"] < 200, report
    assert report["launcher"]["summed_peak_mib"] >= 64, report


def test_unknown_arms_are_refused_by_name(capsys):
    done = subprocess.run([sys.executable, str(scale.ROOT / "scripts" / "scale_run.py"), "--arms", "pool-9"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "unknown arm(s) ['pool-9']" in done.stderr


def test_rounds_replace_the_arm_rounds_and_the_window_arm_differs_only_by_its_window():
    assert scale.arm_config("pool-1099", 3) == scale.ARMS["pool-1099"].replace("num-server-rounds=20",
                                                                               "num-server-rounds=3")
    assert scale.arm_config("hk-s1000", None) == scale.ARMS["hk-s1000"]
    assert scale.ARMS["pool-1099-window"] == scale.ARMS["pool-1099"] + " max-in-flight=100"
    assert scale.arm_folder("pool-1099", 3) == "pool-1099-r3" and scale.arm_folder("pool-1099", None) == "pool-1099"
    done = subprocess.run([sys.executable, str(scale.ROOT / "scripts" / "scale_run.py"), "--rounds", "0"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "--rounds must be >= 1" in done.stderr
