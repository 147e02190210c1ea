"""The confirmatory groups study: its design file, the choice on validation only, the table and comparisons,
and a run with the test images locked end to end."""

import json

import numpy as np
import pandas as pd
import pytest

from bouquet.analysis.groups_study import StudyDesign, run_curve, study_table, validation_frame
from bouquet.results import RunFolder
from bouquet.tuning import choose_on_validation

DESIGN = """
profile = "confirm"
benchmarks = ["a", "b"]
candidates = ["early", "late"]
references = ["fedavg", "ifca"]
tune-seeds = [100]
seeds = [0, 1, 2]
ari-rounds = [3]
comparisons = [["chosen", "ifca"], ["chosen", "fedavg"]]
"""


def curve(errors, ari=None):
    rounds = np.arange(1, len(errors) + 1)
    return pd.DataFrame({"round": rounds, "error": errors, "ari": ari if ari is not None else [np.nan] * len(errors),
                         "k": [4.0] * len(errors)})


def test_the_shipped_design_loads_and_a_bad_one_is_named(tmp_path):
    from pathlib import Path

    shipped = StudyDesign.load(Path(__file__).parents[1] / "experiments" / "groups" / "studies" / "confirm.toml")
    assert len(shipped.seeds) >= 5 and not set(shipped.seeds) & set(shipped.tune_seeds)
    assert {"digits-rotate-8", "digits-permute-8"} <= set(shipped.benchmarks)
    path = tmp_path / "d.toml"
    path.write_text(DESIGN)
    assert StudyDesign.load(path).comparisons == (("chosen", "ifca"), ("chosen", "fedavg"))
    path.write_text(DESIGN.replace("tune-seeds = [100]", "tune-seeds = [2]"))
    with pytest.raises(ValueError, match=r"tune-seeds and seeds must be disjoint .* both hold \[2\]"):
        StudyDesign.load(path)
    path.write_text(DESIGN + 'rounds = 3\n')
    with pytest.raises(ValueError, match=r"unknown keys \['rounds'\]"):
        StudyDesign.load(path)
    path.write_text(DESIGN.replace('["chosen", "ifca"]', '["chosen", "cfl"]'))
    with pytest.raises(ValueError, match="comparison 'chosen' vs 'cfl'"):
        StudyDesign.load(path)


def test_one_form_is_chosen_on_the_mean_validation_error_over_rounds_and_benchmarks():
    # "early" is better in the first rounds on a, "late" at the end; over the rounds and both benchmarks,
    # early's mean is (30 + 10 + 10) / 3 = 16.67 on a and 20 on b; late's (60 + 20 + 5) / 3 = 28.33 and 10
    curves = {("a", "early", 100): curve([30, 10, 10]), ("a", "late", 100): curve([60, 20, 5]),
              ("b", "early", 100): curve([20, 20, 20]), ("b", "late", 100): curve([10, 10, 10])}
    frame = validation_frame(curves)
    assert set(frame["seed"]) == {"a:100", "b:100"} and set(frame["arm"]) == {"memory"}
    choice = choose_on_validation(frame, "val-error")
    assert choice.loc[choice["chosen"], "candidate"].tolist() == ["early"]  # 18.33 < 19.17
    assert choice["val-error-mean"].round(2).tolist() == [18.33, 19.17]


def test_the_table_reports_every_arm_and_every_designed_comparison_with_paired_intervals():
    design = StudyDesign("confirm", ("a",), ("early", "late"), ("fedavg", "ifca"), (100,), (0, 1, 2), (3,),
                         (("chosen", "ifca"), ("chosen", "fedavg")))
    curves = {}
    for seed in (0, 1, 2):
        curves["a", "early", seed] = curve([50, 20, 10, 5 + seed], ari=[0.5, 0.9, 1.0, 1.0])
        curves["a", "ifca", seed] = curve([60, 40, 20, 8 + seed * 1.5], ari=[0.1, 0.2, 0.8, 0.7 + 0.1 * seed])
        curves["a", "fedavg", seed] = curve([70, 60, 50, 40.0])
    table, comparisons = study_table(curves, design, "early")
    assert table["arm"].tolist() == ["chosen: early", "ifca", "fedavg"]
    chosen = table.iloc[0]
    assert chosen["final error (%)"] == pytest.approx(6.0) and chosen["mean error (%)"] == pytest.approx(21.5)
    assert chosen["ARI r3"] == "1.00 (1.00)" and table.iloc[1]["ARI r4"] == "0.80 (0.70)"
    assert chosen["final vs FedAvg"] == "-85.0 %"
    ifca = comparisons[comparisons["comparison"] == "chosen - ifca"].iloc[0]
    # final differences per seed: -3, -3.5, -4 -> mean -3.5, 95 % half-width t(2) * 0.5 / sqrt(3) = 1.24
    assert ifca["final error difference (points)"] == "-3.50 [-4.74, -2.26]" and ifca["final: excludes 0"]
    assert comparisons["comparison"].tolist() == ["chosen - ifca", "chosen - fedavg"]


def test_a_vision_run_with_the_test_images_locked_scores_validation_only(run_app):
    folder, stdout = run_app('task="vision" vision-partitioner="iid" vision-groups="permute" vision-num-groups=2 '
                             'vision-evaluation="clients" vision-client-test-size=20 validation-fraction=0.2 '
                             'score-test=false strategy="hk-cosine" hk-opinion-space="updates" '
                             'coalition-models="personal" coalition-memory=true coalition-memory-evidence="stacked" '
                             'coalition-memory-formation="linkage" coalition-memory-tau="majority" '
                             "num-server-rounds=2 clients-per-round=2 local-batches=2", supernodes=4)
    run = RunFolder(folder)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["scored-on"] == "validation" and summary["client-val-accuracy-mean"] is not None
    assert "client-accuracy-mean" not in summary and "test images locked" in stdout
    clients = run.table("evaluate_clients")
    assert "val-accuracy" in clients and "accuracy" not in clients
    errors = run_curve(run, "val-accuracy")
    assert errors["round"].tolist() == [1, 2] and errors["error"].between(0, 100).all()
    with pytest.raises(ValueError, match="no 'accuracy' in evaluate_clients.csv"):
        run_curve(run, "accuracy")
    assert all("first-tau" in r for r in run.rounds("train"))


def test_central_evaluation_of_locked_test_images_is_refused():
    from bouquet.config import AppConfig
    from bouquet.serving.vision import VisionServer

    config = AppConfig.from_run_config({"task": "vision", "score-test": False, "validation-fraction": 0.2,
                                        "vision-evaluation": "central"})
    with pytest.raises(ValueError, match="score-test = false locks the test images, which vision-evaluation = "
                                         "'central' scores"):
        VisionServer(config).begin(None, None)
