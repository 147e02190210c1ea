"""The known-groups study runner and its figure script: a 2-arm x 2-round smoke run, the layers, hand cases."""

import json

import numpy as np
import pandas as pd
import pytest

from bouquet.analysis import groups_figures
from bouquet.studies import ROOT, group_cosines, run_groups_experiments

RUNNER = run_groups_experiments
#: Arms that fine-tune on the node, which only the water task implements (a clear error on images).
WATER_ONLY_ARMS = {"fedavg-finetune"}


@pytest.mark.tier2  # second tier: the study runner is first-tier in test_sckm_experiments.py; rotated digits in test_e2e_clustered.py
@pytest.mark.e2e
def test_smoke_run_on_rotated_digits_writes_every_figure_and_resumes(tmp_path, capsys, ray_head):
    runner, figures = RUNNER, groups_figures
    args = ["--data", "digits-rotate", "--profile", "smoke", "--arms", "fedavg,ifca", "--seeds", "0",
            "--out", str(tmp_path), "--ray-address", ray_head.address]
    assert runner.main(args) == 0
    base = tmp_path / "digits-rotate-smoke"
    for arm in ("fedavg", "ifca"):
        summary = json.loads((base / arm / "seed-0" / "summary.json").read_text())
        assert summary["strategy"] == arm and summary["rounds"] == 2 and summary["clients-evaluated"] == 8
    assert runner.main(args) == 0  # resumable: nothing left to run
    assert "2 runs, 2 already done" in capsys.readouterr().out

    figures.main([str(base), "--out", str(tmp_path / "fig")])
    for name in ("ari_per_round", "k_per_round", "error_per_round", "error_per_group", "served_error"):
        assert (tmp_path / "fig" / f"{name}.png").stat().st_size > 1000, name
        assert len(pd.read_csv(tmp_path / "fig" / f"{name}.csv")) > 0, name
    per_group = pd.read_csv(tmp_path / "fig" / "error_per_group.csv", index_col=0)
    assert list(per_group.columns) == ["0", "1", "2", "3"] and list(per_group.index) == ["fedavg", "ifca"]
    table = pd.read_csv(tmp_path / "fig" / "table.csv").set_index("arm")
    assert table.loc["fedavg", "vs fedavg (%)"] == 0.0
    assert table.loc["ifca", "K final"] == 4 and 0 <= table.loc["ifca", "served ARI final"] <= 1
    served = pd.read_csv(tmp_path / "fig" / "served_error.csv")
    assert len(served) == 16 and set(served.loc[served["arm"] == "fedavg", "model"]) == {"shared"}


def test_every_arm_and_benchmark_resolves_to_a_valid_app_config():
    import tomllib

    from bouquet.config import AppConfig, ConfigError, with_preset
    from bouquet.launch import parse_overrides

    runner = RUNNER
    defaults = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    arms = sorted(p.stem for p in (runner.EXPERIMENTS / "arms").glob("*.toml"))
    assert {"fedavg", "hk-shared", "ifca", "cfl", "local", "fixed-k-personal"} <= set(arms)
    for data in ("digits-rotate", "digits-permute", "water-types"):
        for arm in arms:
            job = runner.job(data, "quick", arm, 1, ROOT / "unused")
            if arm in WATER_ONLY_ARMS and data != "water-types":
                with pytest.raises(ConfigError, match="'personalize-epochs'.*not implemented for the vision task"):
                    AppConfig.from_run_config({**defaults, **with_preset(job.run_config)})
                continue
            config = AppConfig.from_run_config({**defaults, **with_preset(job.run_config)})
            assert config.sampling.seed == 1 and job.folder.parts[-2:] == (arm, "seed-1")
            assert config.vision_data.seed == 1 and config.water_data.synthetic.seed == 1  # fresh data per seed
            assert job.supernodes == (60 if data == "water-types" else 20), (data, arm)
    for data in ("digits-rotate-8", "digits-permute-8"):  # the confirmatory study's eight-group benchmarks
        job = runner.job(data, "confirm", "hk-memory-features", 2, ROOT / "unused")
        config = AppConfig.from_run_config({**defaults, **with_preset({**job.run_config, "clients-per-round": 20})})
        assert job.supernodes == 40 and config.vision_data.num_groups == 8 == config.ifca.k
        assert config.vision_data.validation_fraction == 0.2 and config.run.num_server_rounds == 50
    rotate = runner.job("digits-rotate", "quick", "ifca", 0, ROOT).run_config
    assert rotate["ifca-k"] == 4 and rotate["vision-groups"] == "rotate" and rotate["strategy"] == "ifca"
    paper_cfl = runner.job("digits-rotate", "quick", "cfl", 0, ROOT).run_config
    assert (paper_cfl["cfl-eps1"], paper_cfl["cfl-eps2"], paper_cfl["cfl-warmup"]) == (0.4, 1.6, 20)
    assert parse_overrides("ifca-k=3") == {"ifca-k": 3}


def test_unknown_arm_and_missing_data_file_are_clear_errors(tmp_path, monkeypatch):
    runner = RUNNER
    with pytest.raises(SystemExit, match="unknown arm 'nope'"):
        runner.main(["--arms", "nope", "--out", str(tmp_path)])
    monkeypatch.setattr(runner, "ROOT", tmp_path)  # the data path resolves under an empty project
    with pytest.raises(SystemExit, match="data file not found"):
        runner.main(["--data", "daiad", "--arms", "fedavg", "--out", str(tmp_path)])


def test_ari_target_round_is_the_first_from_which_every_seed_stays_above():
    first = groups_figures.first_round_at
    curves = pd.DataFrame({"round": [1, 2, 3, 4, 1, 2, 3, 4], "ari": [0.2, 0.95, 0.5, 1.0, 0.1, 0.9, 0.92, 0.91]})
    assert first(curves, 0.9) == 4  # seed 0 dips at round 3
    assert first(curves, 0.05) == 1
    assert first(curves, 1.01) is None


def test_coalition_stability_between_consecutive_rounds(tmp_path):
    figures = groups_figures
    run = tmp_path / "hk" / "seed-0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    pd.DataFrame({"round": [1, 1, 1, 1, 2, 2, 2, 3, 3, 3],
                  "partition-id": [0, 1, 2, 3, 0, 1, 2, 0, 1, 2],
                  "coalition": ["a", "a", "b", "b", "x", "x", "y", "p", "q", "p"]}).to_csv(run / "coalitions.csv",
                                                                                          index=False)
    stable = figures.coalition_stability(figures.load_runs(tmp_path))
    # round 2 vs 1 over clients 0-2: {0,1},{2} in both -> ARI 1; round 3 vs 2: {0,2},{1} vs {0,1},{2} -> ARI -0.5
    assert stable["round"].tolist() == [2, 3]
    assert stable["stability"].tolist() == pytest.approx([1.0, -0.5])


def test_group_cosines_split_pairs_within_and_between_groups():
    probe = group_cosines  # its describe(); the pair split is bouquet.analysis.probes'
    vectors = np.array([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [0.1, 1.0]])
    groups = np.array(["a", "a", "b", "b"])
    cosines = probe.cosine_matrix(vectors)
    within, between = probe.split_pairs(cosines, groups)
    assert len(within) == 2 and len(between) == 4
    assert within.min() > 0.99 and between.max() < 0.2
    row = probe.describe(3, "updates", cosines, groups)
    assert row["round"] == 3 and row["within >= 0.9"] == 1.0 and row["between < 0.3"] == 1.0


def test_client_errors_of_data_without_groups(tmp_path):
    from bouquet.results import RunFolder

    figures = groups_figures
    run = tmp_path / "fedavg" / "seed-0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    pd.DataFrame({"round": [1, 1], "node_id": [5, 6], "partition-id": [0, 1], "household": ["a", "b"],
                  "model": ["shared", "shared"], "mae-litres": [10.0, 30.0]}).to_csv(
        run / "evaluate_clients.csv", index=False)
    errors, unit = figures.client_errors({"fedavg": [RunFolder(run)]})
    assert unit == "MAE (L/day)" and errors["group"].isna().all() and errors["error"].tolist() == [10.0, 30.0]


def test_errors_at_rounds_and_the_choice_on_validation_are_computed_by_hand(tmp_path):
    from bouquet.results import RunFolder

    figures = groups_figures
    errors = pd.DataFrame({"arm": ["a"] * 4 + ["b"] * 4, "seed": ["seed-0", "seed-0", "seed-1", "seed-1"] * 2,
                           "round": [1, 2, 1, 2] * 2, "error": [10.0, 6.0, 20.0, 8.0, 12.0, 4.0, 22.0, 2.0]})
    records = pd.DataFrame({"arm": ["a", "a", "b", "b"], "seed": ["seed-0", "seed-1"] * 2, "round": [2] * 4,
                            "ari": [1.0, 0.5, 0.2, 0.4], "k": [4, 3, 20, 18]})
    at = figures.at_rounds_table(errors, records, [2]).set_index("arm")
    assert at.loc["a", "error"] == 7.0 and at.loc["a", "ARI"] == 0.75 and at.loc["a", "ARI (lowest seed)"] == 0.5
    assert at.loc["b", "error"] == 3.0 and at.loc["b", "K"] == 19
    paired = figures.paired_table(errors[errors["round"] <= 1], ["a"]).set_index("arm")
    assert paired.loc["b", "difference"] == pytest.approx(2.0)  # round 1: (12 - 10 + 22 - 20) / 2
    runs = {}
    for arm, values in {"tau-0.5": (30.0, 32.0, 1.0), "tau-0.9": (31.0, 30.0, 99.0)}.items():
        for seed, value in enumerate(values):  # seed 2 is not a tuning seed: its number is never read
            folder = tmp_path / arm / f"seed-{seed}"
            folder.mkdir(parents=True)
            (folder / "summary.json").write_text(json.dumps({"val-mae-litres-mean": value}))
            runs.setdefault(arm, []).append(RunFolder(folder))
    choices = figures.validation_choices(runs, ["hk=tau-0.5,tau-0.9"], ["seed-0", "seed-1"]).set_index("candidate")
    assert choices.loc["tau-0.9", "chosen"] and not choices.loc["tau-0.5", "chosen"]
    assert choices.loc["tau-0.9", "val-mae-mean"] == 30.5 and choices.loc["tau-0.5", "seeds"] == 2
    (tmp_path / "tau-0.9" / "seed-0" / "summary.json").write_text("{}")
    with pytest.raises(SystemExit, match="no validation MAE"):
        figures.validation_choices(runs, ["hk=tau-0.5,tau-0.9"], ["seed-0", "seed-1"])


def test_a_data_file_is_required_only_where_the_run_reads_it(tmp_path):
    """A profile may switch a DAIAD dataset to the synthetic pool and leave ``data-path`` set (the hk-paper smoke
    profile does): no file is read then, so none is required; an image folder always is."""
    from bouquet.experiments import require_data_files

    absent = str(tmp_path / "absent.zip")
    require_data_files({"data-source": "synthetic", "data-path": absent})
    with pytest.raises(SystemExit, match=r"data file not found \(data-path\)"):
        require_data_files({"data-source": "daiad", "data-path": absent})
    with pytest.raises(SystemExit, match=r"data file not found \(vision-data-path\)"):
        require_data_files({"task": "vision", "vision-data-path": absent})
