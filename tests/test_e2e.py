"""End to end: `flwr run` against a real local SuperLink (simulation runtime), as a user runs it."""

import json
from pathlib import Path

import pandas as pd
import pytest

from bouquet.launch import local_superlink

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e


def run_app(tmp_path, run_config: str, supernodes: int = 4):
    results = tmp_path / "results"
    with local_superlink(tmp_path / "link") as link:
        done = link.flwr_run(ROOT, run_config=f'{run_config} results-dir="{results}" run-name="e2e"',
                             federation_config=f"num-supernodes={supernodes} client-resources-num-cpus=1")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return results / "e2e", done.stdout


def test_fedavg_water_run_writes_results_and_learns(tmp_path):
    folder, stdout = run_app(tmp_path, "num-server-rounds=3 clients-per-round=3 local-epochs=2 "
                                       "synthetic-households=200 active-factor=0.5")
    assert "bouquet summary: fedavg, 3 rounds, 4 clients" in stdout
    config = json.loads((folder / "config.json").read_text())
    assert config["num-server-rounds"] == 3 and config["strategy"] == "fedavg"
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    train = [r for r in rounds if r["phase"] == "train"]
    evaluate = [r for r in rounds if r["phase"] == "evaluate"]
    assert [r["round"] for r in train] == [1, 2, 3] and [r["round"] for r in evaluate] == [1, 2, 3]
    assert all(r["replies"] == 3 and r["rejected"] == 0 for r in train)
    assert evaluate[-1]["mse"] < evaluate[0]["mse"], evaluate  # the held-out loss went down
    clients = pd.read_csv(folder / "clients.csv")
    assert sorted(clients["partition-id"]) == [0, 1, 2, 3]
    assert clients["mae-litres"].gt(0).all() and clients["num-examples"].gt(0).all()
    pool = pd.read_csv(folder / "pool.csv")
    assert set(clients["household"]) <= set(pool.loc[pool["status"] == "pool", "household"])
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["clients-evaluated"] == 4
    assert summary["mae-litres-mean"] == pytest.approx(clients["mae-litres"].mean())


def test_bad_run_config_value_stops_with_a_clear_message(tmp_path):
    with local_superlink(tmp_path / "link") as link:
        done = link.flwr_run(ROOT, run_config='strategy="fedavgx"', federation_config="num-supernodes=2")
    assert "unknown strategy 'fedavgx'" in done.stdout + done.stderr
