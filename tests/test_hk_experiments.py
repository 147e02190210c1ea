"""The HK experiment runner and figure script: a 2-arm x 2-round smoke run writes every figure and CSV, and an
interrupted run goes on from its checkpoint to the same numbers."""

import json

import pandas as pd
import pytest

from bouquet.analysis import hk_figures
from bouquet.forecasting.naive import NAIVE_FORECASTERS
from bouquet.studies import run_hk_experiments

pytestmark = pytest.mark.e2e


@pytest.mark.tier2  # second tier: the study runner is first-tier in test_sckm_experiments.py
def test_smoke_run_writes_every_figure_and_csv_and_resumes(tmp_path, capsys, ray_head):
    runner, figures = run_hk_experiments, hk_figures
    args = ["--data", "synthetic", "--profile", "smoke", "--arms", "fedavg,hk-cosine-0.75", "--seeds", "0",
            "--supernodes", "4", "--out", str(tmp_path), "--ray-address", ray_head.address]
    assert runner.main(args) == 0
    base = tmp_path / "synthetic-smoke"
    for arm in ("fedavg", "hk-cosine-0.75"):
        summary = json.loads((base / arm / "seed-0" / "summary.json").read_text())
        assert summary["strategy"] == ("fedavg" if arm == "fedavg" else "hk-cosine") and summary["rounds"] == 2
    assert runner.main(args) == 0  # resumable: nothing left to run
    assert "2 runs, 2 already done" in capsys.readouterr().out

    # a run interrupted after round 1 (its summary and the round-2 checkpoint never written) goes on from there
    run = base / "fedavg" / "seed-0"
    finished = json.loads((run / "summary.json").read_text())
    (run / "summary.json").unlink()
    (run / "checkpoints" / "round-0002.npz").unlink()
    assert runner.main(args) == 0
    out = capsys.readouterr().out
    assert "2 runs, 1 already done" in out and "(resumed after round 1)" in out, out
    resumed = json.loads((run / "summary.json").read_text())
    assert resumed["resumed-after-round"] == 1
    assert {k: v for k, v in resumed.items() if "wall" not in k and k != "resumed-after-round"} == \
        {k: v for k, v in finished.items() if "wall" not in k}
    assert "===== resumed: (resumed after round 1) =====" in (base / "fedavg" / "seed-0.log").read_text()

    figures.main([str(base), "--out", str(tmp_path / "fig")])
    names = ["mse_per_round", "accuracy_per_round", "final_mae", "coalitions_per_round", "forecasts", "trajectories"]
    for name in names:
        assert (tmp_path / "fig" / f"{name}.png").stat().st_size > 1000, name
        assert len(pd.read_csv(tmp_path / "fig" / f"{name}.csv")) > 0, name
    table = pd.read_csv(tmp_path / "fig" / "final_mae.csv")
    naive = {f"naive: {name}" for name in NAIVE_FORECASTERS if name != "blend"}
    assert set(table["arm"]) == {"fedavg", "hk-cosine-0.75"} | naive  # the naive forecasters beside every method
    best = table.loc[table["arm"].isin(naive), "mae_mean"].min()
    fedavg = table.set_index("arm").loc["fedavg"]
    assert fedavg["skill"] == pytest.approx(1 - fedavg["mae_mean"] / best)
    assert "| fedavg | 1 |" in (tmp_path / "fig" / "final_mae.md").read_text()
    forecasts = pd.read_csv(tmp_path / "fig" / "forecasts.csv")
    assert forecasts["arm"].str.startswith("naive: ").any()  # the best naive line is drawn


def test_unknown_arm_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="unknown arm 'nope'"):
        run_hk_experiments.main(["--arms", "nope", "--out", str(tmp_path)])


def test_per_round_is_empty_when_no_run_records_the_column():
    # a study without coalition arms (FedProx and Per-FedAvg only) still gets its figures

    figures = hk_figures
    rounds = pd.DataFrame({"arm": ["fedprox", "fedprox"], "round": [1, 2], "phase": ["train", "train"],
                           "train-loss": [0.5, 0.4]})
    assert figures.per_round(rounds, "coalitions", "train").empty
    assert figures.per_round(rounds, "train-loss", "train")["mean"].tolist() == [0.5, 0.4]


def test_a_run_whose_server_app_fails_is_reported_with_flowers_status(tmp_path, capsys, ray_head):
    from pathlib import Path

    from bouquet.experiments import Job, run_jobs

    root = Path(__file__).resolve().parents[1]
    # a cosine threshold above 1: the ServerApp refuses the config
    bad = Job("bad", {"hk-tau": 7.0, "num-server-rounds": 1}, tmp_path / "bad" / "seed-0", 2)
    assert run_jobs(root, [bad], tmp_path / "link", describe=str, ray_address=ray_head.address) == 1
    out = capsys.readouterr().out
    assert "FAILED (exit 0; run " in out and "ended finished:failed" in out, out  # flwr run itself exits 0
    assert "ended finished:failed" in (tmp_path / "bad" / "seed-0.log").read_text()
