"""The attack study runner and its figure script: the plan, every arm x attack as a valid config, a smoke run."""

import json

import pandas as pd
import pytest

from bouquet.analysis import attack_figures
from bouquet.studies import ROOT, run_attack_experiments

RUNNER = run_attack_experiments


def _plan(*args):
    runner = RUNNER
    return runner.plan(runner.build_parser().parse_args(list(args)))


def test_the_plan_runs_each_no_attack_condition_once_per_arm_and_seed():
    jobs = _plan("--data", "digits", "--arms", "fedavg,krum", "--attacks", "sign-flip,alie", "--fractions", "0", "0.1",
                 "0.2", "--seeds", "0", "1", "--out", "/unused")
    names = [j.label for j in jobs]
    assert len(jobs) == 2 * (1 + 2 * 2) * 2 and names.count("fedavg none-0 seed 0") == 1
    attacked = next(j for j in jobs if j.label == "krum alie-0.2 seed 1")
    assert attacked.run_config["attack"] == "alie" and attacked.run_config["attack-fraction"] == 0.2
    assert attacked.folder.parts[-3:] == ("krum", "alie-0.2", "seed-1")
    clean = next(j for j in jobs if j.label == "krum none-0 seed 0")
    assert "attack" not in clean.run_config


def test_bad_study_arguments_stop_with_a_clear_message():
    with pytest.raises(SystemExit, match="unknown attack"):
        _plan("--attacks", "sign-flip,nuke")
    with pytest.raises(SystemExit, match="fractions must be in"):
        _plan("--fractions", "0", "1.0")


def test_every_arm_and_attack_resolves_to_a_valid_app_config():
    import tomllib

    from bouquet.algorithms.attacks import ATTACKS
    from bouquet.config import AppConfig, with_preset

    runner = RUNNER
    defaults = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    arms = sorted(p.stem for p in (runner.EXPERIMENTS / "arms").glob("*.toml"))
    assert {"fedavg", "fedavg-oracle", "hk-paper", "hk-robust", "hk-robust-form", "hk-robust-relative",
            "hk-robust-updates", "krum",
            "multikrum", "bulyan", "fedmedian", "fedtrimmedavg"} == set(arms)
    for data, skip in (("digits", "target-shift"), ("water", "label-flip")):
        for arm in arms:
            for attack in (a for a in ATTACKS if a not in ("none", skip)):
                job = runner.job(data, "quick", arm, attack, 0.3, 2, ROOT / "unused")
                config = AppConfig.from_run_config({**defaults, **with_preset(job.run_config)})
                assert config.attack.attack == attack and config.sampling.seed == 2


@pytest.mark.tier2  # second tier: the study runner is first-tier in test_sckm_experiments.py
@pytest.mark.e2e
def test_smoke_study_writes_the_table_and_figures_and_resumes(tmp_path, capsys, ray_head):
    runner, figures = RUNNER, attack_figures
    args = ["--data", "digits", "--profile", "smoke", "--arms", "krum", "--attacks", "sign-flip",
            "--fractions", "0", "0.2", "--seeds", "0", "--out", str(tmp_path), "--ray-address", ray_head.address]
    assert runner.main(args) == 0
    base = tmp_path / "digits-smoke"
    summary = json.loads((base / "krum" / "sign-flip-0.2" / "seed-0" / "summary.json").read_text())
    assert len(summary["attackers"]) == 4 and 0 <= summary["accuracy-honest-mean"] <= 1
    assert runner.main(args) == 0
    assert "2 runs, 2 already done" in capsys.readouterr().out
    figures.main([str(base), "--out", str(tmp_path / "fig")])
    table = pd.read_csv(tmp_path / "fig" / "table.csv")
    assert len(table) == 2 and set(table["arm"]) == {"krum"}
    clean = table[(table["fraction"] == 0)]
    assert (clean["change (%)"] == 0).all()
    krum = table[(table["arm"] == "krum") & (table["fraction"] == 0.2)]
    assert 0 <= float(krum["attackers among kept (%)"].iloc[0]) <= 100
    for name in ("error_vs_fraction", "change_vs_fraction"):
        assert (tmp_path / "fig" / f"{name}.png").stat().st_size > 1000
        assert len(pd.read_csv(tmp_path / "fig" / f"{name}.csv")) > 0
