"""The SCKM experiment runner and figure script: a 2-arm x 2-round smoke run writes every figure and CSV."""

import json

import numpy as np
import pandas as pd
import pytest

from bouquet.analysis import sckm_figures
from bouquet.config import AppConfig
from bouquet.studies import run_sckm_experiments

pytestmark = pytest.mark.e2e


def test_smoke_run_writes_every_figure_and_csv_and_resumes(tmp_path, capsys, ray_head):
    from types import SimpleNamespace

    from bouquet import client_app

    runner, figures = run_sckm_experiments, sckm_figures
    args = ["--study", "select", "--data", "digits", "--profile", "smoke", "--settings", "c10-s2-b2",
            "--arms", "sckm-cluster,random", "--seeds", "0", "--out", str(tmp_path), "--ray-address", ray_head.address]
    assert runner.main(args) == 0
    base = tmp_path / "select-digits-smoke"
    for arm in ("sckm-cluster", "random"):
        summary = json.loads((base / "c10-s2-b2" / arm / "seed-0" / "summary.json").read_text())
        assert summary["selection"] == arm and len(summary["accuracy-per-round"]) == 3  # rounds 0, 1, 2
    assert len(json.loads((base / "c10-s2-b2" / "sckm-cluster" / "seed-0" / "summary.json").read_text())
               ["clusters-per-round"]) == 2
    assert runner.main(args) == 0  # resumable: nothing left to run
    assert "2 runs, 2 already done" in capsys.readouterr().out

    figures.main([str(base), "--out", str(tmp_path / "fig")])
    for name in ("accuracy_per_round", "clusters_per_round"):
        assert (tmp_path / "fig" / f"{name}.png").stat().st_size > 1000, name
    for name in ("accuracy_per_round", "table", "seeds", "clusters_per_round", "c_star", "rounds_to_target"):
        assert len(pd.read_csv(tmp_path / "fig" / f"{name}.csv")) > 0, name
    facts = pd.read_csv(tmp_path / "fig" / "selection_facts.csv").set_index("arm")
    assert set(facts.index) == {"sckm-cluster", "random"}
    for arm in ("sckm-cluster", "random"):  # classes covered, from what each trained client's ClientApp holds
        run = base / "c10-s2-b2" / arm / "seed-0"
        config = AppConfig.from_run_config(json.loads((run / "config.json").read_text()))
        trained = pd.read_csv(run / "train_clients.csv")
        covered = [len(set().union(*(set(client_app.node_task(config, SimpleNamespace(
            node_config={"partition-id": k, "num-partitions": 10})).y.tolist())
            for k in part["partition-id"]))) for _, part in trained.groupby("round")]
        assert facts.loc[arm, "classes-covered"] == pytest.approx(np.mean(covered)), arm
        assert facts.loc[arm, "distinct-clients"] == trained["partition-id"].nunique()
    assert np.isnan(facts.loc["random", "loss-rank"]) and 1 <= facts.loc["sckm-cluster", "loss-rank"] <= 9.5
    seeds = pd.read_csv(tmp_path / "fig" / "seeds.csv").set_index("arm")
    random_curve = json.loads((base / "c10-s2-b2" / "random" / "seed-0" / "summary.json").read_text())[
        "accuracy-per-round"]  # rounds 0-2 are all within the last 5
    assert seeds.loc["random", "last5-mean"] == pytest.approx(100 * np.mean(random_curve))
    table = pd.read_csv(tmp_path / "fig" / "table.csv")
    assert set(table["arm"]) == {"sckm-cluster", "random"} and set(table["budget"]) == {2}
    assert "**Select = 2**" in (tmp_path / "fig" / "table.md").read_text()

    # runs.csv keeps every curve; with --add-runs it stands in for run folders that are gone
    runs = pd.read_csv(tmp_path / "fig" / "runs.csv")
    assert len(runs) == 6 and runs[runs["arm"] == "random"]["accuracy"].tolist() == pytest.approx(
        [100 * a for a in random_curve])
    empty = tmp_path / "empty"
    empty.mkdir()
    figures.main([str(empty), "--out", str(tmp_path / "again"), "--add-runs", str(tmp_path / "fig" / "runs.csv")])
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "again" / "table.csv"), table)
    # ... and the selection_facts.csv beside it stands in for theirs
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "again" / "selection_facts.csv"),
                                  pd.read_csv(tmp_path / "fig" / "selection_facts.csv"))
    older = runs.assign(accuracy=runs["accuracy"] + 50)  # same runs as the folders: the folders win
    moved = runs.assign(setting="c10-s5-b2", shards=5)  # a setting whose folders are gone: added
    pd.concat([older, moved]).to_csv(tmp_path / "older.csv", index=False)
    facts_then = pd.read_csv(tmp_path / "fig" / "selection_facts.csv")
    pd.concat([facts_then.assign(**{"classes-covered": 99.0}), facts_then.assign(setting="c10-s5-b2")]).to_csv(
        tmp_path / "selection_facts.csv", index=False)  # beside older.csv: the folders win again, c10-s5-b2 added
    figures.main([str(base), "--out", str(tmp_path / "merged"), "--add-runs", str(tmp_path / "older.csv")])
    merged = pd.read_csv(tmp_path / "merged" / "table.csv").set_index("arm")
    assert merged["shard 2"].to_dict() == pytest.approx(table.set_index("arm")["shard 2"].to_dict())
    assert merged["shard 5"].to_dict() == pytest.approx(table.set_index("arm")["shard 2"].to_dict())
    assert len(pd.read_csv(tmp_path / "merged" / "runs.csv")) == 12
    facts_merged = pd.read_csv(tmp_path / "merged" / "selection_facts.csv")
    assert len(facts_merged) == 4 and (facts_merged["classes-covered"] < 99).all()
    assert set(facts_merged["setting"]) == {"c10-s2-b2", "c10-s5-b2"}


def test_a_profile_table_named_after_a_study_applies_to_that_study_only(tmp_path):
    runner = run_sckm_experiments
    select = runner.job("cifar10", "full", "c10-s2-b2", "sckm-select", 0, tmp_path, "select")
    cluster = runner.job("cifar10", "full", "c50-s2-b4", "sckm-cluster", 0, tmp_path, "cluster")
    assert select.run_config["num-server-rounds"] == 60 and cluster.run_config["num-server-rounds"] == 120
    assert cluster.run_config["vision-model"] == "vgg16" and cluster.run_config["clients-per-round"] == 4
    assert not set(runner.STUDIES) & (set(select.run_config) | set(cluster.run_config))
    AppConfig.from_run_config(cluster.run_config)  # every key is a valid run-config key


def test_a_profile_extends_another(tmp_path):
    from bouquet.experiments import load_profile

    runner = run_sckm_experiments
    longer = runner.job("cifar10", "cpu-60", "c10-s2-b2", "sckm-select", 0, tmp_path, "select").run_config
    base = runner.job("cifar10", "cpu", "c10-s2-b2", "sckm-select", 0, tmp_path, "select").run_config
    assert longer == base | {"num-server-rounds": 60} and "extends" not in longer
    profiles = tmp_path / "experiments"
    (profiles / "profiles").mkdir(parents=True)
    (profiles / "profiles" / "a.toml").write_text('extends = "b"\n')
    (profiles / "profiles" / "b.toml").write_text('extends = "a"\n')
    with pytest.raises(SystemExit, match="extends itself: a -> b -> a"):
        load_profile(profiles, "a", "select", ("select", "cluster"))


def test_every_shipped_job_has_the_run_config_it_had_before_the_layering_moved_into_the_package():
    # the layers of every (profile, study, setting, arm) as the runner merged them on f9bee8a:
    # data < profile (its own study table last, other studies' dropped) < setting < arm < seed, paths absolute
    import tomllib

    runner = run_sckm_experiments
    root = runner.EXPERIMENTS

    def old(data, profile, setting, arm, study):
        def load(kind, name):
            return tomllib.loads((root / kind / f"{name}.toml").read_text())

        def prof(name):
            layer = load("profiles", name)
            base = layer.pop("extends", None)
            tables = {s: layer.pop(s) for s in runner.STUDIES if s in layer}
            return (prof(base) if base else {}) | layer | tables.get(study, {})

        layers = load("data", data) | prof(profile)
        setting_layer = load("settings", setting)
        setting_layer.pop("num-supernodes")
        layers |= setting_layer | load("arms", arm)
        if layers.get("vision-data-path"):
            layers["vision-data-path"] = str((runner.ROOT / layers["vision-data-path"]).resolve())
        return {**layers, "seed": 0}

    for profile in sorted(p.stem for p in (root / "profiles").glob("*.toml")):
        for study, plan in runner.STUDIES.items():
            for setting in plan["settings"]:
                for arm in plan["arms"]:
                    job = runner.job("cifar10", profile, setting, arm, 0, root, study)
                    assert job.run_config == old("cifar10", profile, setting, arm, study), (profile, setting, arm)


def test_unknown_layer_names_are_refused():
    runner = run_sckm_experiments
    with pytest.raises(SystemExit, match="known: "):
        runner.main(["--data", "digits", "--profile", "smoke", "--settings", "c7-s1-b1", "--seeds", "0"])


def test_rounds_to_target_hand_case_and_no_learning_setting(tmp_path):
    figures = sckm_figures
    curves = {("c10-s2-b2", "sckm-select"): [10, 12, 20, 30], ("c10-s2-b2", "random"): [10, 11, 28, 20],
              ("c10-s1-b2", "sckm-select"): [10, 9, 10, 9], ("c10-s1-b2", "random"): [10, 10, 9, 9]}
    runs = pd.DataFrame([{"setting": s, "arm": a, "seed": 0, "round": r, "accuracy": acc}
                         for (s, a), curve in curves.items() for r, acc in enumerate(curve)])
    figures.rounds_to_target(runs, tmp_path)
    table = pd.read_csv(tmp_path / "rounds_to_target.csv").set_index(["setting", "arm"])
    # target = 0.9 x best final (30) = 27: SCKM first reaches it in round 3, random in round 2
    assert table.loc[("c10-s2-b2", "sckm-select"), "rounds-to-target"] == 3
    assert table.loc[("c10-s2-b2", "random"), "rounds-to-target"] == 2
    assert table.loc[("c10-s2-b2", "random"), "sckm-saving-%"] == pytest.approx(100 * (1 - 3 / 2))
    # nobody learned: the target (0.9 x 9) is below the untrained model's 10 %, so no round is reported
    assert not table.loc[("c10-s1-b2", "random"), "target-above-start"]
    assert table.loc["c10-s1-b2", "rounds-to-target"].isna().all()


def test_selection_facts_hand_case():
    figures = sckm_figures
    classes = [{0}, {0, 1}, {2}, {3, 4}]
    trained = {1: [0, 1], 2: [1, 2], 3: [3, 0]}
    losses = {1: {10: 0.5, 11: 0.9, 12: 0.1}, 2: {10: 0.2, 11: 0.3, 12: 0.4}}
    chosen = {1: [10, 11], 2: [12]}  # ranks 2 and 1, then 1
    facts = figures.run_selection_facts(trained, classes, losses, chosen)
    assert facts == {"classes-covered": pytest.approx((2 + 3 + 3) / 3), "reused-rounds": 1, "distinct-clients": 4,
                     "loss-rank": pytest.approx(4 / 3)}
    assert np.isnan(figures.run_selection_facts(trained, classes)["loss-rank"])


def test_table_of_a_budget_missing_a_shard_count_marks_it_not_run(tmp_path):
    figures = sckm_figures
    curves = {"c10-s1-b2": [10, 10, 10, 10, 10], "c10-s2-b2": [10, 12, 14, 16, 18], "c10-s2-b3": [10, 20, 30, 40, 50]}
    runs = pd.DataFrame([{"setting": s, "arm": "random", "seed": 0, "round": r, "accuracy": acc,
                          "shards": int(s[5]), "budget": int(s[8])}
                         for s, curve in curves.items() for r, acc in enumerate(curve)])
    figures.tables(runs, tmp_path)
    table = pd.read_csv(tmp_path / "table.csv").set_index("budget")
    assert list(table.columns[:3]) == ["arm", "shard 1", "shard 2"]
    assert table.loc[2, "shard 1"] == 10 and table.loc[2, "shard 2"] == 15  # rounds 1-4 of 4: (12+14+16+18)/4
    assert np.isnan(table.loc[3, "shard 1"]) and table.loc[3, "all avg"] == 35
    text = (tmp_path / "table.md").read_text()
    assert "| random | - | 35.00 |" in text and "shard 1 not run" in text.split("**Select = 3**")[1]
