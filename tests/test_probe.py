"""The pair-wise feature probe (SCKM paper Section 4): each feature by hand, the BCE probe, rank and Rel.A."""

import numpy as np
import pytest

from bouquet.algorithms.probe import (
    FEATURES,
    fit_logistic_bce,
    minmax_labels,
    p_inner,
    pair_features,
    probe_losses,
    rank_and_relative_accuracy,
)
from bouquet.analysis import feature_probe


def test_each_feature_on_a_hand_case():
    g, h = np.array([1.0, -2.0]), np.array([3.0, 0.0])
    f = pair_features(g, h)
    assert set(f) == set(FEATURES)
    # g - h = (-2, -2); g + h = (4, -2)
    assert f["d1"] == pytest.approx(4.0)
    assert f["d2"] == pytest.approx(np.sqrt(8))
    assert f["d3"] == pytest.approx(16 ** (1 / 3))
    assert f["d4"] == pytest.approx(32 ** (1 / 4))
    assert f["d2sq"] == pytest.approx(8.0)
    # <g,h>_1 = (|4|+|-2| - (|-2|+|-2|)) / 4 = 0.5; ||g||_1 = 3, ||h||_1 = 3
    assert p_inner(g, h, 1) == pytest.approx(0.5)
    assert f["cos1"] == pytest.approx(0.5 / 9)
    # <g,h>_2 = (sqrt(20) - sqrt(8)) / 4; ||g||_2 = sqrt(5), ||h||_2 = 3
    assert f["cos2"] == pytest.approx((np.sqrt(20) - np.sqrt(8)) / 4 / (np.sqrt(5) * 3))
    # moments: mean(g^k + h^k)
    assert f["m1"] == pytest.approx((1 - 2 + 3 + 0) / 2)
    assert f["m2"] == pytest.approx((1 + 4 + 9 + 0) / 2)
    assert f["m3"] == pytest.approx((1 - 8 + 27 + 0) / 2)
    assert f["m4"] == pytest.approx((1 + 16 + 81 + 0) / 2)
    # SCKM = mean(g h^2 + g^2 h) = ((9 + 3) + (0 + 0)) / 2
    assert f["sckm"] == pytest.approx(6.0)
    with pytest.raises(ValueError):
        pair_features(g, np.ones(3))


def test_zero_vector_has_zero_cosines():
    f = pair_features(np.zeros(3), np.ones(3))
    assert all(f[f"cos{p}"] == 0.0 for p in (1, 2, 3, 4))


def test_logistic_probe_recovers_a_soft_label_model():
    rng = np.random.default_rng(0)
    x = rng.normal(size=400)
    y = 1 / (1 + np.exp(-(2.0 * (x - x.mean()) / x.std() - 0.5)))  # soft labels from a known logistic model
    loss, w, b = fit_logistic_bce(x, y)
    assert w == pytest.approx(2.0, abs=1e-4) and b == pytest.approx(-0.5, abs=1e-4)
    entropy = np.mean(-y * np.log(y) - (1 - y) * np.log(1 - y))  # the minimum possible BCE
    assert loss == pytest.approx(entropy, abs=1e-8)
    with pytest.raises(ValueError, match="labels"):
        fit_logistic_bce(x, y + 1)


def test_the_feature_that_determines_the_label_ranks_first():
    rng = np.random.default_rng(1)
    n = 300
    informative = rng.normal(size=n)
    labels = minmax_labels(1 / (1 + np.exp(-4 * informative)))
    features = {"noise-a": rng.normal(size=n), "informative": informative, "noise-b": rng.normal(size=n),
                "constant": np.ones(n)}
    losses = probe_losses(features, labels)
    ranks, rel = rank_and_relative_accuracy(losses)
    assert ranks["informative"] == 1.0
    assert rel["informative"] == max(rel.values()) > 0.3
    assert min(rel.values()) == 0.0  # the worst feature scores 0 by definition (eq. 7)
    assert sorted(ranks.values()) == [1.0, 2.0, 3.0, 4.0]


def test_ties_share_their_rank_and_labels_are_minmax():
    ranks, rel = rank_and_relative_accuracy({"a": 1.0, "b": 1.0, "c": 2.0})
    assert ranks == {"a": 1.5, "b": 1.5, "c": 3.0}
    assert rel == {"a": 0.5, "b": 0.5, "c": 0.0}
    np.testing.assert_allclose(minmax_labels(np.array([2.0, 4.0, 3.0])), [0.0, 1.0, 0.5])
    np.testing.assert_allclose(minmax_labels(np.array([7.0, 7.0])), [0.5, 0.5])


def test_probe_script_writes_pairs_and_tables(tmp_path):
    import pandas as pd

    from bouquet.studies import sckm_probe

    sckm_probe.main(["--data", "digits", "--shards", "1", "--rounds", "1", "2", "--seeds", "0",
                               "--clients", "4", "--local-batches", "2", "--out", str(tmp_path)])
    pairs = pd.read_csv(tmp_path / "probe_pairs.csv")
    assert len(pairs) == 2 * 6  # 2 probed rounds x C(4, 2) pairs
    assert set(FEATURES) <= set(pairs.columns) and pairs["label"].between(0, 1).all()
    for round_pairs in pairs.groupby("round")["label"]:  # min-max within each slice
        assert round_pairs[1].min() == 0.0 or round_pairs[1].nunique() == 1
    rank = pd.read_csv(tmp_path / "probe_rank.csv")
    assert set(rank["charac"]) == {"shards", "round", "all"}
    assert (tmp_path / "probe_rel_a.md").read_text().startswith("| charac | type | cos1")
    clients = pd.read_csv(tmp_path / "probe_clients.csv")
    assert len(clients) == 2 * 4 and set(clients["client"]) == {0, 1, 2, 3}
    for (_, t), part in clients.groupby(["seed", "round"]):  # partner accuracy: mean of the client's 3 pairs
        scores = pairs[pairs["round"] == t]
        for k in range(4):
            mine = scores[(scores["i"] == k) | (scores["j"] == k)]["val-accuracy"]
            assert part.loc[part["client"] == k, "partner-accuracy"].item() == pytest.approx(mine.mean())
    summary = (tmp_path / "probe_clients.md").read_text()
    assert summary.count("\n| 1 | ") == 2 * 2 and "top-2 eta pair" in summary  # 2 probed rounds in both tables


def test_client_rows_eta_is_sckm_selects_and_partner_accuracy_is_a_mean_by_hand():
    from bouquet.algorithms.sckm import layer_coordinate_weights, sckm_eta

    g = np.array([[1.0, -2.0, 0.5], [0.0, 1.0, 1.0], [2.0, 0.5, -1.0]])
    rows = feature_probe.client_rows(g, [2, 1], [0.3, 0.2, 0.1], [1, 2, 2], [(0, 1), (0, 2), (1, 2)],
                                            [0.5, 0.7, 0.9])
    weighted = g * layer_coordinate_weights(g, [2, 1], "normalized")
    np.testing.assert_allclose([r["eta"] for r in rows], sckm_eta(weighted))
    np.testing.assert_allclose([r["sketch-norm"] for r in rows], np.linalg.norm(weighted, axis=1))
    assert [r["partner-accuracy"] for r in rows] == pytest.approx([0.6, 0.7, 0.8])
    assert [r["classes"] for r in rows] == [1, 2, 2] and [r["loss"] for r in rows] == [0.3, 0.2, 0.1]


def test_chosen_pair_percentile_by_hand():
    import pandas as pd


    pairs = pd.DataFrame({"shards": 2, "seed": 0, "round": 5, "i": [0, 0, 1], "j": [1, 2, 2],
                          "val-accuracy": [0.3, 0.1, 0.2]})
    clients = pd.DataFrame({"shards": 2, "seed": 0, "round": 5, "client": [0, 1, 2],
                            "eta": [0.9, 0.1, 0.5], "loss": [0.1, 2.0, 1.0]})
    row = feature_probe.chosen_pair_percentiles(pairs, clients).iloc[0]
    assert row["eta-pair"] == 0.0  # clients 0 and 2: pair (0, 2) at 0.1, no pair is worse
    assert row["loss-pair"] == pytest.approx(100 / 3)  # clients 1 and 2: pair (1, 2) at 0.2, only (0, 2) is worse
