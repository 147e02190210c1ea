"""The variant study's table (issue 22): per arm and setting, each seed's last-5 mean, then mean and std over seeds."""

import numpy as np
import pandas as pd
import pytest

from bouquet.analysis import sckm_figures


def test_variant_table_by_hand(tmp_path):
    figures = sckm_figures
    rows = []
    for arm, level in (("random", 20.0), ("sckm-update-neg-classifier", 25.0)):
        for seed in (0, 1):
            for rnd in range(11):  # rounds 6-10 are the last 5
                rows.append({"setting": "c10-s5-b2", "shards": 5, "budget": 2, "arm": arm, "seed": seed,
                             "round": rnd, "accuracy": level + seed + (rnd if rnd > 5 else -100)})
    rows.append({"setting": "c10-s2-b2", "shards": 2, "budget": 2, "arm": "random", "seed": 0, "round": 10,
                 "accuracy": 11.0})
    table = figures.variant_table(pd.DataFrame(rows), tmp_path)
    written = pd.read_csv(tmp_path / "table.csv")
    assert list(written.columns) == ["variant", "shards", "budget", "seeds", "last5_mean", "last5_std"]
    five = written[written["shards"] == 5].set_index("variant")
    # seed means over rounds 6-10: level + seed + 8; over seeds: level + 8.5, std of (x, x + 1) = 0.7071
    assert five.loc["sckm-update-neg-classifier", "last5_mean"] == pytest.approx(33.5)
    assert five.loc["random", "last5_mean"] == pytest.approx(28.5)
    assert five.loc["random", "last5_std"] == pytest.approx(np.sqrt(0.5))
    assert list(five.index) == ["sckm-update-neg-classifier", "random"]  # best first
    two = written[written["shards"] == 2].iloc[0]
    assert two["seeds"] == 1 and np.isnan(two["last5_std"]) and two["last5_mean"] == 11.0
    assert len(table) == 3
    assert "| sckm-update-neg-classifier | 2 | 33.50 +- 0.71 | +5.00 |" in (tmp_path / "table.md").read_text()


def test_selection_facts_of_a_local_update_run_follow_the_aggregated_updates(tmp_path):
    import json

    from bouquet.config import AppConfig

    figures = sckm_figures
    run = tmp_path / "base" / "c4-s1-b1" / "sckm-update-pos-concat" / "seed-0"
    run.mkdir(parents=True)
    config = AppConfig.from_run_config({"task": "vision", "shards-per-client": 1})
    (run / "config.json").write_text(json.dumps(config.to_run_config()))
    # every one of 4 clients trains in both rounds; the rounds aggregate partition 2, then partition 2 again
    nodes = {0: 100, 1: 101, 2: 102, 3: 103}
    rows = ["round,node_id,partition-id,household,train-loss,num-examples"]
    rows += [f"{r},{nodes[p]},{p},,1.0,10" for r in (1, 2) for p in range(4)]
    (run / "train_clients.csv").write_text("\n".join(rows) + "\n")
    (run / "rounds.jsonl").write_text("".join(json.dumps({"round": r, "phase": "train", "update-nodes": [102]}) + "\n"
                                              for r in (1, 2)))
    assert figures.selection_facts(tmp_path / "base", tmp_path) is None  # no summary.json yet: an unfinished run
    (run / "summary.json").write_text("{}")
    facts = figures.selection_facts(tmp_path / "base", tmp_path).set_index("arm").loc["sckm-update-pos-concat"]
    classes = figures._client_classes(config.vision_data, 4)
    assert facts["distinct-clients"] == 1 and facts["reused-rounds"] == 1  # not 4 clients, re-used every round
    assert facts["classes-covered"] == len(classes[2])


def test_smoothed_curves_average_the_rounds_up_to_each_round(tmp_path):
    figures = sckm_figures
    rows = [{"setting": "c10-s2-b2", "arm": "random", "seed": seed, "round": rnd, "accuracy": acc + 10 * seed}
            for seed in (0, 1) for rnd, acc in enumerate([10.0, 20.0, 60.0, 0.0])]
    curves = figures.smoothed_curves(pd.DataFrame(rows), window=2)
    # seed means 15, 25, 65, 5; then the mean of each round and the one before it (round 0 alone)
    assert curves["accuracy"].tolist() == [15.0, 25.0, 65.0, 5.0]
    assert curves["smoothed"].tolist() == [15.0, 20.0, 45.0, 35.0]
    figures.smoothed_figure(pd.DataFrame(rows), tmp_path, window=2)
    assert (tmp_path / "accuracy_smoothed.png").stat().st_size > 1000
    assert len(pd.read_csv(tmp_path / "accuracy_smoothed.csv")) == 4


def test_versus_random_pairs_each_arm_with_random_of_the_same_seed(tmp_path):
    figures = sckm_figures

    def run(shards, arm, seed, early, late):  # rounds 0-60: `early` up to round 55, `late` in rounds 56-60
        return [{"setting": f"c10-s{shards}-b2", "shards": shards, "budget": 2, "arm": arm, "seed": seed,
                 "round": rnd, "accuracy": late if rnd > 55 else early} for rnd in range(61)]

    rows = (run(5, "random", 0, 20.0, 20.0) + run(5, "random", 1, 21.0, 21.0)
            + run(5, "x", 0, 23.0, 30.0) + run(5, "x", 1, 20.0, 20.0)
            + run(2, "random", 0, 10.0, 10.0) + run(2, "x", 0, 15.0, 15.0)
            + run(2, "y", 3, 50.0, 50.0))  # no random run with seed 3: no pair
    table = figures.versus_random(pd.DataFrame(rows), tmp_path)
    assert list(table["variant"]) == ["x", "x", "x"] and list(table["shards"]) == [2, 5, "all"]
    five = table[table["shards"] == 5].iloc[0]
    # seed 0: last 5 = 30 - 20 = 10; last 50 (rounds 11-60) = (45 x 23 + 5 x 30) / 50 - 20 = 3.7; seed 1: -1, -1
    assert five["pairs"] == 2 and five["above_last50"] == 1
    assert five["diff_last5_mean"] == pytest.approx(4.5) and five["diff_last50_mean"] == pytest.approx(1.35)
    # t(0.975, 1) = 12.7062; std of (10, -1) = 7.7782; / sqrt(2)
    assert five["diff_last5_ci95"] == pytest.approx(12.7062 * 7.7782 / np.sqrt(2), rel=1e-4)
    two = table[table["shards"] == 2].iloc[0]
    assert two["pairs"] == 1 and two["diff_last5_mean"] == 5.0 and np.isnan(two["diff_last5_ci95"])
    pooled = table[table["shards"] == "all"].iloc[0]
    assert pooled["pairs"] == 3 and pooled["above_last50"] == 2
    assert pooled["diff_last5_mean"] == pytest.approx(14 / 3) and pooled["diff_last50_mean"] == pytest.approx(7.7 / 3)
    written = pd.read_csv(tmp_path / "versus_random.csv")
    assert list(written.columns) == ["variant", "shards", "budget", "pairs", "diff_last5_mean", "diff_last5_ci95",
                                     "diff_last50_mean", "diff_last50_ci95", "above_last50"]
    assert "| x | 5 | 2 | +4.50 +- 69.88 | +1.35 +- " in (tmp_path / "versus_random.md").read_text()


def test_coverage_correlation_ranks_arms_by_classes_covered_and_late_accuracy(tmp_path):
    figures = sckm_figures
    arms = {"random": (3.4, 25.0), "a": (3.0, 20.0), "b": (3.2, 24.0), "fedcor-gp": (3.8, 33.0), "c": (3.1, 26.0)}
    runs = pd.DataFrame([{"setting": "c10-s2-b2", "arm": arm, "seed": seed, "round": rnd,
                          "accuracy": acc + seed if rnd > 10 else 0.0}
                         for arm, (_, acc) in arms.items() for seed in (0, 1) for rnd in range(61)])
    facts = pd.DataFrame([{"setting": "c10-s2-b2", "arm": arm, "seed": seed, "classes-covered": cov}
                          for arm, (cov, _) in arms.items() for seed in (0, 1)])
    table = figures.coverage_correlation(runs, facts, tmp_path).iloc[0]
    # coverage order a < c < b < random < fedcor, accuracy order a < b < random < c < fedcor: one swap in 5
    assert table["arms"] == 5
    assert table["spearman"] == pytest.approx(1 - 6 * (0 + 1 + 1 + 4 + 0) / (5 * 24))
    # without fedcor: a < c < b < random against a < b < random < c
    assert table["spearman_without_fedcor"] == pytest.approx(1 - 6 * (0 + 4 + 1 + 1) / (4 * 15))
    assert (tmp_path / "coverage_vs_accuracy.csv").exists()
