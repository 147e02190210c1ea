"""End to end: a simulation whose SuperLink (and with it the ServerApp) is SIGKILLed after round k, resumed with
``resume-from``, ends with the same numbers and files as an uninterrupted run of the same seed."""

import json
import os
import signal
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bouquet.launch import local_superlink, parse_overrides, resume_overrides
from bouquet.processes import command_line, descendants
from bouquet.results import RunFolder
from tests.waiting import wait_for_checkpoint

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[1]

ROUNDS = 4
FEDERATION = "num-supernodes=4 client-resources-num-cpus=1"
#: Columns that name Flower's node ids (new in every simulation run) or wall time: not compared.
RUN_DEPENDENT = ("node", "seconds", "wall")
NODE_LISTS = ("selected",)


def _comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in NODE_LISTS and not any(word in k for word in RUN_DEPENDENT)}


def _table(folder, name):
    frame = pd.read_csv(folder / f"{name}.csv")
    return frame[[c for c in frame.columns if not any(word in c for word in RUN_DEPENDENT)]]


def _simulation_processes(root: int) -> list[int]:
    """The ``flwr-simulation`` processes (ServerApp + simulation engine) under the SuperLink ``root``."""
    return [pid for pid in descendants(root) if "flwr-simulation" in command_line(pid)]


def _kill_after_checkpoint(link, folder, k, run_config):
    """Start the run, SIGKILL its ServerApp process (``flwr-simulation``) once the checkpoint of round ``k`` is on
    disk, then stop the SuperLink too (the server machine is gone)."""
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.update(done=link.flwr_run(
        ROOT, run_config=run_config, federation_config=FEDERATION, timeout=600)))
    runner.start()
    wait_for_checkpoint(folder, k, runner, detail=lambda: f": {outcome}")
    victims = _simulation_processes(link.process.pid)
    assert victims, "no flwr-simulation process under the SuperLink"
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    link.stop()
    runner.join(timeout=120)
    return outcome


@pytest.mark.parametrize("test_seed, extra", [
    (0, 'strategy="hk-cosine"'),
    pytest.param(1, 'strategy="hk-cosine" coalition-models="personal" hk-opinion-space="updates" hk-tau=0.5',
                 marks=pytest.mark.tier2),  # second tier: the same resume path as "hk", with coalition models
    pytest.param(2, 'task="vision" selection="sckm-select" selection-mode="piggyback" strategy="fedavg"',
                 marks=pytest.mark.tier2),  # second tier: the same resume path, with the selector's state
    (4, ('strategy="hk-cosine" coalition-models="personal" hk-opinion-space="updates" coalition-memory=true '
         'coalition-memory-tau="otsu" coalition-memory-formation="linkage" coalition-memory-decay=0.7')),
], ids=["hk", "hk-personal", "sckm-piggyback", "hk-memory"])
def test_a_killed_run_resumes_to_the_numbers_of_an_uninterrupted_one(tmp_path, superlink, ray_head, test_seed, extra):
    # the round after which the server dies: at least two rounds before the end, so that a fast run (the vision
    # case takes well under a second a round) cannot finish between the checkpoint and the SIGKILL
    k = int(np.random.default_rng(test_seed).integers(1, ROUNDS - 1))
    common = (f'{extra} num-server-rounds={ROUNDS} clients-per-round=3 local-epochs=1 synthetic-households=150 '
              f'active-factor=0.5 seed=3 results-dir="{tmp_path / "results"}"')
    done = superlink.flwr_run(ROOT, run_config=f'{common} run-name="whole"', federation_config=FEDERATION)
    whole = tmp_path / "results" / "whole"
    assert done.returncode == 0 and (whole / "summary.json").exists(), (
        done.stdout[-3000:] + done.stderr[-3000:] + "\nSuperLink runs: " + superlink.run_statuses())

    crashed = tmp_path / "results" / "crashed"
    with local_superlink(tmp_path / "link-1", env={"RAY_ADDRESS": ray_head.address}) as link:
        _kill_after_checkpoint(link, crashed, k, f'{common} run-name="crashed"')
    assert not (crashed / "summary.json").exists()

    resume = resume_overrides(crashed)
    assert parse_overrides(resume)["resume-from"] == str(crashed.resolve())
    with local_superlink(tmp_path / "link-2", env={"RAY_ADDRESS": ray_head.address}) as link:
        done = link.flwr_run(ROOT, run_config=resume, federation_config=FEDERATION)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert f"resume: {crashed.resolve()} after round" in output

    a, b = json.loads((whole / "summary.json").read_text()), json.loads((crashed / "summary.json").read_text())
    assert b.pop("resumed-after-round") >= k
    assert _comparable(a) == _comparable(b)
    rounds_a, rounds_b = RunFolder(whole).rounds(), RunFolder(crashed).rounds()
    assert [(r["round"], r["phase"]) for r in rounds_b] == [(r["round"], r["phase"]) for r in rounds_a]  # once each
    assert [_comparable(r) for r in rounds_b] == [_comparable(r) for r in rounds_a]
    tables = sorted(p.stem for p in whole.glob("*.csv"))
    assert tables == sorted(p.stem for p in crashed.glob("*.csv")) and "train_clients" in tables
    for table in tables:
        pd.testing.assert_frame_equal(_table(crashed, table), _table(whole, table))
    if "predictions" in tables:
        assert (whole / "predictions.csv").read_bytes() == (crashed / "predictions.csv").read_bytes()
