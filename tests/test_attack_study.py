"""The attack study under the protocol: its design, the honest error, the choice on validation only, the table and
comparisons, and one end-to-end pass on a tiny design."""

import json

import numpy as np
import pandas as pd
import pytest

from bouquet.analysis.attack_study import (
    METRICS,
    AttackStudyDesign,
    StudyArm,
    attack_table,
    comparisons,
    condition_name,
    honest_error,
    run_facts,
    tuning_frame,
)
from bouquet.results import RunFolder
from bouquet.studies import ROOT, probe_label_flip_directions, run_attack_study
from bouquet.tuning import choose_on_validation

DESIGN = """
data = "digits"
profile = "smoke"
keys = { validation-fraction = 0.2 }
oracle = "fedavg-oracle"
robust = "hk-robust"
flower = ["multikrum"]
tune-conditions = [["none", 0.0], ["sign-flip", 0.2]]
conditions = [["sign-flip", 0.2], ["ipm", 0.2]]
tune-seeds = [100]
seeds = [0, 1]

[arms.fedavg-oracle]
[arms.hk-robust]
grid = { coalition-update-min-cosine = [-1.0, 0.0] }
[arms.multikrum]
grid = { robust-num-malicious-nodes = [2, 4] }
"""


def _design(**changes):
    arms = (StudyArm("fedavg-oracle", "fedavg-oracle"),
            StudyArm("hk-robust", "hk-robust", grid={"coalition-update-min-cosine": [-1.0, 0.0]}),
            StudyArm("multikrum", "multikrum", grid={"robust-num-malicious-nodes": [2, 4]}))
    fields = {"data": "digits", "profile": "smoke", "keys": {}, "arms": arms, "oracle": "fedavg-oracle",
              "robust": "hk-robust", "flower": ("multikrum",), "tune_conditions": (("none", 0.0), ("sign-flip", 0.2)),
              "attacked": (("sign-flip", 0.2), ("ipm", 0.2)), "tune_seeds": (100,), "seeds": (0, 1, 2)}
    return AttackStudyDesign(**{**fields, **changes})


def test_the_shipped_design_loads_and_a_bad_one_is_named(tmp_path):
    shipped = AttackStudyDesign.load(ROOT / "experiments" / "attacks" / "studies" / "protocol.toml")
    tuned = [len(arm.candidates()) for arm in shipped.arms if arm.grid]
    assert len(set(tuned)) == 1 and tuned[0] >= 3  # every tuned arm the same budget
    assert len(shipped.seeds) >= 5 and not set(shipped.seeds) & set(shipped.tune_seeds)
    assert {a for a, _ in shipped.attacked} == {"sign-flip", "scale", "alie", "ipm", "label-flip"}
    assert {f for _, f in shipped.attacked} == {0.1, 0.2, 0.3}
    path = tmp_path / "design.toml"
    path.write_text(DESIGN + 'extra = 1\n')
    with pytest.raises(ValueError, match=r"unknown keys \['extra'\]"):
        AttackStudyDesign.load(path)
    path.write_text(DESIGN.replace("[arms.multikrum]", "[arms.multikrum]\nlayr = 'x'"))
    with pytest.raises(ValueError, match=r"arm 'multikrum' has unknown keys \['layr'\]"):
        AttackStudyDesign.load(path)


@pytest.mark.parametrize("changes, message", [
    ({"seeds": (100, 1)}, "must be disjoint"),
    ({"oracle": "fedavg"}, "oracle arm 'fedavg' is not among the arms"),
    ({"flower": ("krum",)}, "flower arm 'krum'"),
    ({"attacked": (("nuke", 0.2),)}, "unknown attacks"),
    ({"attacked": (("none", 0.2),)}, "unknown attacks"),
    ({"attacked": (("ipm", 0.5),)}, "honest majority"),
    ({"metric": "rmse"}, "metric must be one of"),
    ({"arms": (StudyArm("fedavg-oracle", "fedavg-oracle"), StudyArm("hk-robust", "hk-robust", grid={"a": [1, 2, 3]}),
               StudyArm("multikrum", "multikrum", grid={"b": [1, 2]}))}, "the same tuning budget"),
])
def test_a_bad_design_is_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        _design(**changes)


def test_the_oracle_runs_once_per_fraction_for_every_attack():
    design = _design()
    assert design.conditions() == [("none", 0.0), ("sign-flip", 0.2), ("ipm", 0.2)]
    assert design.conditions_of("fedavg-oracle") == [("none", 0.0), ("sign-flip", 0.2)]
    wider = _design(attacked=(("ipm", 0.2), ("sign-flip", 0.1), ("ipm", 0.1)))
    assert wider.conditions_of("fedavg-oracle") == [("none", 0.0), ("ipm", 0.2), ("sign-flip", 0.1)]
    assert wider.oracle_stand_in("ipm", 0.1) == ("sign-flip", 0.1)
    assert condition_name("none", 0.0) == "none-0" and condition_name("ipm", 0.2) == "ipm-0.2"


def _run_folder(path, rows):
    path.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(path / "evaluate_clients.csv", index=False)
    return RunFolder(path)


def test_the_honest_error_reads_the_last_round_without_the_attackers(tmp_path):
    run = _run_folder(tmp_path / "run", [
        {"round": 1, "partition-id": 0, "attacker": False, "val-accuracy": 0.1},
        {"round": 2, "partition-id": 0, "attacker": False, "val-accuracy": 0.8},
        {"round": 2, "partition-id": 1, "attacker": False, "val-accuracy": 0.6},
        {"round": 2, "partition-id": 2, "attacker": True, "val-accuracy": 0.0}])
    assert honest_error(run, "val-accuracy") == pytest.approx(30.0)  # 100 * (1 - mean(0.8, 0.6))
    with pytest.raises(ValueError, match="no 'accuracy'"):
        honest_error(run, "accuracy")
    only_attackers = _run_folder(tmp_path / "bad", [{"round": 1, "attacker": True, "accuracy": 0.5}])
    with pytest.raises(ValueError, match="no honest client"):
        honest_error(only_attackers, "accuracy")


def test_the_water_error_is_the_honest_households_final_mae(tmp_path):
    path = tmp_path / "water"
    path.mkdir()
    pd.DataFrame([{"partition-id": 0, "attacker": False, "mae-litres": 80.0, "val-mae-litres": 70.0},
                  {"partition-id": 1, "attacker": False, "mae-litres": 100.0, "val-mae-litres": 90.0},
                  {"partition-id": 2, "attacker": True, "mae-litres": 900.0, "val-mae-litres": 900.0}]
                 ).to_csv(path / "clients.csv", index=False)
    table, test, validation, accuracy = METRICS["mae-litres"]
    assert honest_error(RunFolder(path), test, accuracy, table) == pytest.approx(90.0)  # litres, no 100 - x
    assert honest_error(RunFolder(path), validation, accuracy, table) == pytest.approx(80.0)
    design_path = tmp_path / "design.toml"
    design_path.write_text('metric = "mae-litres"\n' + DESIGN)
    assert AttackStudyDesign.load(design_path).metric == "mae-litres"
    assert AttackStudyDesign.load(ROOT / "experiments" / "attacks" / "studies" / "protocol.toml").metric == "accuracy"


def test_the_choice_averages_over_conditions_and_never_reads_a_test_number():
    # candidate a: better without attack, far worse under sign flips; b wins on the mean over both conditions
    errors = {("hk-robust", "a", "none-0", 100): 10.0, ("hk-robust", "a", "sign-flip-0.2", 100): 50.0,
              ("hk-robust", "b", "none-0", 100): 12.0, ("hk-robust", "b", "sign-flip-0.2", 100): 14.0}
    frame = tuning_frame(errors).assign(**{"test-error": [0.0, 0.0, 99.0, 99.0]})  # carried, never read
    choices = choose_on_validation(frame, "val-error")
    assert choices.loc[choices["chosen"], "candidate"].tolist() == ["b"]
    assert choices["seeds"].tolist() == [2, 2]


def _errors(design):
    rng = np.random.default_rng(0)
    errors = {}
    for arm in ("fedavg-oracle", "hk-robust", "multikrum"):
        for attack, fraction in design.conditions_of(arm):
            for seed in design.seeds:
                base = {"fedavg-oracle": 20.0, "hk-robust": 21.0, "multikrum": 30.0}[arm]
                errors[(arm, condition_name(attack, fraction), seed)] = base + (attack != "none") + rng.normal() * 0.1
    return errors


def test_the_table_pairs_each_cell_with_the_oracle_of_the_same_seeds():
    design = _design()
    errors = _errors(design)
    table = attack_table(errors, design, ["fedavg-oracle", "hk-robust", "multikrum"])
    assert len(table) == 3 * 3 and (table["seeds"] == 3).all()
    ipm = table[(table["arm"] == "hk-robust") & (table["attack"] == "ipm")].iloc[0]
    # the oracle's sign-flip run stands for ipm: the paired difference is against it, seed by seed
    diffs = [errors[("hk-robust", "ipm-0.2", s)] - errors[("fedavg-oracle", "sign-flip-0.2", s)] for s in design.seeds]
    assert ipm["vs-oracle"] == pytest.approx(np.mean(diffs)) and ipm["vs-oracle-half"] > 0
    oracle_ipm = table[(table["arm"] == "fedavg-oracle") & (table["attack"] == "ipm")].iloc[0]
    assert oracle_ipm["vs-oracle"] == 0
    compared = comparisons(errors, design)
    assert compared["attack"].tolist() == ["sign-flip", "ipm"] and compared["within-5%"].all()
    assert (compared["best-flower"] == "multikrum").all() and (compared["minus-best-flower"] < -8).all()
    del errors[("hk-robust", "ipm-0.2", 2)]  # a missing seed leaves the cell out rather than averaging fewer
    assert len(attack_table(errors, design, ["hk-robust"])) == 2


def test_the_runner_locks_the_test_images_in_tuning_and_gives_each_run_its_seed():
    design = _design(keys={"validation-fraction": 0.2})
    candidate = design.arm("hk-robust").candidates()[1]
    job = run_attack_study.job(design, candidate, "sign-flip", 0.2, 100, ROOT / "unused", locked=True)
    config = job.run_config
    assert config["score-test"] is False and config["seed"] == config["data-seed"] == 100
    assert config["coalition-update-min-cosine"] == 0.0 and config["validation-fraction"] == 0.2
    assert config["attack"] == "sign-flip" and config["strategy"] == "hk-cosine"
    clean = run_attack_study.job(design, candidate, "none", 0.0, 1, ROOT / "unused", locked=False).run_config
    assert "attack" not in clean and "score-test" not in clean


@pytest.mark.tier2
@pytest.mark.e2e
def test_a_tiny_study_tunes_on_validation_then_scores_the_test_images_once(tmp_path, ray_head, capsys):
    path = tmp_path / "tiny.toml"
    path.write_text(DESIGN.replace("seeds = [0, 1]", "seeds = [0]").replace("[-1.0, 0.0]", "[-1.0, 0.0]"))
    args = ["--design", str(path), "--out", str(tmp_path / "out"), "--ray-address", ray_head.address, "--final",
            "--docs", str(tmp_path / "docs")]
    assert run_attack_study.main(args) == 0
    out = tmp_path / "out" / "tiny"
    for config in (out / "tuning").rglob("seed-*.run-config.toml"):
        assert "score-test = false" in config.read_text()
    choices = pd.read_csv(out / "choices.csv")
    assert set(choices["arm"]) == {"hk-robust", "multikrum"} and choices["chosen"].sum() == 2
    table = pd.read_csv(tmp_path / "docs" / "table.csv")
    assert set(table["arm"]) == {"fedavg-oracle", "hk-robust", "multikrum"} and len(table) == 3 * 3
    assert (tmp_path / "docs" / "table.md").read_text().count("|") > 10
    runs = pd.read_csv(tmp_path / "docs" / "runs.csv")
    assert {"error", "share", "attackers-out", "honest-out"} <= set(runs.columns) and len(runs) == 3 * 3 - 1
    assert "hk-robust" in (tmp_path / "docs" / "defences.md").read_text()
    log = [json.loads(line) for line in (out / "test-log.jsonl").read_text().splitlines()]
    assert len(log) == 1 and set(log[0]["chosen"]) == {"fedavg-oracle", "hk-robust", "multikrum"}
    assert run_attack_study.main(args) == 0  # resumes: every run is done
    assert "already done" in capsys.readouterr().out
    (tmp_path / "docs" / "table.csv").unlink()
    assert run_attack_study.main([*args, "--report-only"]) == 0  # the tables again, no run, no new test pass
    assert len(pd.read_csv(tmp_path / "docs" / "table.csv")) == 3 * 3
    assert len((out / "test-log.jsonl").read_text().splitlines()) == 2  # the resumed pass logged, the report not


def test_run_facts_count_the_screens_catches_and_mistakes(tmp_path):
    import json as _json

    rounds = [{"round": 1, "phase": "train", "attacker-share": 0.0, "attacker-nodes": [7, 8], "replies": 10,
               "screened-nodes": [7, 8, 3]},
              {"round": 1, "phase": "evaluate"},
              {"round": 2, "phase": "train", "attacker-share": 0.2, "attacker-nodes": [7, 8], "replies": 10,
               "screened-nodes": []}]
    (tmp_path / "rounds.jsonl").write_text("".join(_json.dumps(r) + "\n" for r in rounds))
    facts = run_facts(RunFolder(tmp_path))
    # 2 of 4 attacker replies left out, 1 of 16 honest ones; the share averaged over the two rounds
    assert facts == {"share": pytest.approx(0.1), "attackers-out": 0.5, "honest-out": 1 / 16}
    (tmp_path / "rounds.jsonl").write_text(_json.dumps({"round": 1, "phase": "train", "replies": 5}) + "\n")
    clean = run_facts(RunFolder(tmp_path))
    assert all(np.isnan(v) for v in clean.values())


def test_the_label_flip_probe_scores_every_round_and_refuses_an_attacker_majority():
    frame = probe_label_flip_directions.label_flip_cosines(rounds=2, clients=6, attackers=1)
    assert list(frame["round"]) == [1, 2]
    values = frame[["honest-lowest", "honest-median", "flipped-highest"]].to_numpy()
    assert np.isfinite(values).all() and (np.abs(values) <= 1).all()
    assert (frame["honest-lowest"] <= frame["honest-median"]).all()
    with pytest.raises(ValueError, match="fewer than half"):
        probe_label_flip_directions.label_flip_cosines(rounds=1, clients=6, attackers=3)


def test_a_follow_up_links_the_earlier_runs_of_the_same_config_and_reruns_nothing_else(tmp_path):
    results = tmp_path / "results"
    earlier = results / "main"
    earlier.mkdir(parents=True)
    (earlier / "design.toml").write_text(DESIGN)
    for arm, seed in (("hk-robust", 0), ("hk-robust", 1), ("multikrum", 0)):
        run = earlier / "final" / arm / "sign-flip-0.2" / f"seed-{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text("{}")
    (earlier / "final" / "hk-robust" / "sign-flip-0.2" / "seed-1" / "summary.json").unlink()  # unfinished
    follow_up = DESIGN.replace('grid = { coalition-update-min-cosine = [-1.0, 0.0] }',
                               'keys = { coalition-update-min-cosine = 0.0 }').replace(
        'grid = { robust-num-malicious-nodes = [2, 4] }', 'keys = { robust-num-malicious-nodes = 6 }')
    path = tmp_path / "follow.toml"
    path.write_text('runs-from = "main"\n' + follow_up)
    design = AttackStudyDesign.load(path)
    assert design.runs_from == "main"
    chosen = {arm.name: arm.candidates()[0] for arm in design.arms}
    out = results / "follow"
    final = {(arm, "sign-flip", 0.2, s): out / "final" / arm / "sign-flip-0.2" / f"seed-{s}"
             for arm in ("hk-robust", "multikrum") for s in (0, 1)}
    assert run_attack_study.link_earlier_runs(design, chosen, final, out) == 1
    linked = final[("hk-robust", "sign-flip", 0.2, 0)]
    assert linked.is_symlink() and linked.resolve() == (earlier / "final" / "hk-robust" / "sign-flip-0.2" /
                                                        "seed-0").resolve()
    # unfinished there, or another setting (MultiKrum f = 6 here, f = 2 or 4 there): run here, not linked
    assert not final[("hk-robust", "sign-flip", 0.2, 1)].exists()
    assert not final[("multikrum", "sign-flip", 0.2, 0)].exists()
