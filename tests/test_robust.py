"""Robust aggregation: HK's clipping and minimum coalition size, and Flower's robust rules as a part."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import Bulyan, FedMedian, FedTrimmedAvg, Krum, MultiKrum

from bouquet.algorithms.hk import HKParams, coalition_weights, hk_aggregate
from bouquet.algorithms.robust import ROBUST_FORM, clip_updates, direction_screen, robust_coalition_weights
from bouquet.config import AppConfig, ConfigError
from bouquet.params import ParamError
from bouquet.server_app import build_strategy
from bouquet.strategies import (
    BouquetStrategy,
    FixedKFedAvg,
    FlowerRobustRule,
    HKFedAvg,
    SharedModel,
    UniformSampler,
    robust_strategy,
)
from bouquet.strategies.params import ROBUST_RULES, CoalitionParams, RobustRuleParams, SamplingParams
from bouquet.strategies.rounds import TrainRound
from tests.flower_fakes import ListRecorder, reply

# ------------------------------------------------------------------ math: clipping


def test_clip_hand_case():
    updates = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, -30.0]])
    clipped, factors = clip_updates(updates, bound=2.0)  # median norm 2.5, cap 5
    np.testing.assert_array_equal(clipped[:3], updates[:3])
    np.testing.assert_allclose(clipped[3], [0.0, -5.0])
    np.testing.assert_allclose(factors, [1, 1, 1, 5 / 30])
    assert updates[3, 1] == -30.0  # the input is not modified


def test_clip_properties_on_random_rounds():
    rng = np.random.default_rng(7)
    for _ in range(50):
        s, d = rng.integers(1, 30), rng.integers(1, 40)
        updates = (rng.normal(size=(s, d)) * rng.lognormal(0, 2, size=(s, 1))).astype(np.float32)
        bound = float(rng.uniform(0.5, 4))
        clipped, factors = clip_updates(updates, bound)
        norms = np.linalg.norm(updates.astype(np.float64), axis=1)
        cap = bound * np.median(norms)
        after = np.linalg.norm(clipped.astype(np.float64), axis=1)
        assert np.all(after <= cap * (1 + 1e-5))  # never above the bound
        under = norms <= cap
        np.testing.assert_array_equal(clipped[under], updates[under])  # below the cap: untouched, bit for bit
        cos = np.sum(clipped[~under] * updates[~under], axis=1) / (after[~under] * norms[~under])
        np.testing.assert_allclose(cos, 1.0, rtol=1e-5)  # the direction is kept
        assert np.all((factors > 0) & (factors <= 1))


def test_clip_with_a_median_of_zero_clips_every_move_to_zero():
    updates = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    clipped, factors = clip_updates(updates, 3.0)
    np.testing.assert_array_equal(clipped, 0.0)
    assert factors.tolist() == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("bound", [0.0, -1.0, np.nan, np.inf])
def test_clip_refuses_a_bad_bound(bound):
    with pytest.raises(ValueError, match="bound must be"):
        clip_updates(np.ones((2, 2)), bound)


def test_clip_refuses_bad_updates():
    with pytest.raises(ValueError, match="non-empty"):
        clip_updates(np.ones((0, 3)), 1.0)
    with pytest.raises(ValueError, match="finite"):
        clip_updates(np.array([[np.nan, 1.0]]), 1.0)

# ------------------------------------------------------------------ math: minimum coalition fraction


def test_min_fraction_hand_cases():
    labels = np.array([0, 0, 0, 1, 2])
    np.testing.assert_allclose(robust_coalition_weights(labels, min_fraction=0.3), [1 / 3, 1 / 3, 1 / 3, 0, 0])
    # 0.2 of 5 clients is 1: every coalition is kept, eq. 16
    np.testing.assert_array_equal(robust_coalition_weights(labels, min_fraction=0.2), coalition_weights(labels))
    # none reaches 0.9: the largest ones (two of size 2) are kept
    np.testing.assert_allclose(robust_coalition_weights(np.array([0, 1, 1, 2, 2]), min_fraction=0.9),
                               [0, 0.25, 0.25, 0.25, 0.25])
    # sample-weighted barycenters inside the kept coalitions
    np.testing.assert_allclose(robust_coalition_weights(np.array([0, 0, 1]), np.array([1.0, 3.0, 5.0]), 0.5),
                               [0.25, 0.75, 0.0])


def test_min_fraction_properties():
    rng = np.random.default_rng(3)
    for _ in range(100):
        s = int(rng.integers(1, 40))
        labels = rng.integers(0, rng.integers(1, s + 1), size=s)
        labels = np.unique(labels, return_inverse=True)[1]  # ids 0..K-1
        examples = rng.integers(1, 100, size=s).astype(float)
        fraction = float(rng.uniform(0, 1))
        weights = robust_coalition_weights(labels, examples, fraction)
        sizes = np.bincount(labels)
        assert np.isclose(weights.sum(), 1.0) and np.all(weights >= 0)
        small = sizes[labels] < fraction * s
        if not small.all():
            assert np.all(weights[small] == 0)  # a coalition below the fraction has zero weight
        np.testing.assert_array_equal(robust_coalition_weights(labels, examples, 0.0),
                                      coalition_weights(labels, examples))


@pytest.mark.parametrize("fraction", [-0.1, 1.5])
def test_min_fraction_refuses_out_of_range(fraction):
    with pytest.raises(ValueError, match="min_fraction must be in"):
        robust_coalition_weights(np.array([0, 1]), min_fraction=fraction)


def test_screen_hand_case():
    # the median of the rows, coordinate by coordinate, is (1, 1); each cosine by hand below
    updates = np.array([[1.0, 1.0], [2.0, 0.0], [0.0, 3.0], [-1.0, -1.0], [1.0, 2.0]])
    keep, cosines = direction_screen(updates, 0.0)
    root2 = np.sqrt(2.0)
    expected = [1.0, 2 / (2 * root2), 3 / (3 * root2), -1.0, 3 / (np.sqrt(5) * root2)]
    np.testing.assert_allclose(cosines, expected)
    assert keep.tolist() == [True, True, True, False, True]
    assert direction_screen(updates, 0.9)[0].tolist() == [True, False, False, False, True]


def test_relative_screen_hand_case():
    # the same rows: cosines 1, 0.707, 0.707, -1, 0.949; their median is 0.707, so relative 0.9 puts the line
    # at 0.636 (above min_cosine 0) and relative 0.5 at 0.354; a min_cosine above the relative line wins
    updates = np.array([[1.0, 1.0], [2.0, 0.0], [0.0, 3.0], [-1.0, -1.0], [1.0, 2.0]])
    assert direction_screen(updates, 0.0, relative=0.5)[0].tolist() == [True, True, True, False, True]
    assert direction_screen(updates, -1.0, relative=1.0)[0].tolist() == [True, True, True, False, True]
    assert direction_screen(updates, 0.9, relative=0.5)[0].tolist() == [True, False, False, False, True]
    # a weak positive row passes the fixed line at 0, not the relative one: the median row is (1, 0.05), so its
    # cosine is (0.2 + 0.05 sqrt(0.96)) / sqrt(1.0025) = 0.2487 against the others' 0.98 or more
    weak = np.vstack([np.tile([1.0, 0.0], (4, 1)) + [[0, 0.1], [0, -0.1], [0, 0.05], [0, -0.05]],
                      [[0.2, np.sqrt(1 - 0.04)]]])
    keep, cosines = direction_screen(weak, 0.0, relative=0.5)
    assert cosines[-1] == pytest.approx((0.2 + 0.05 * np.sqrt(0.96)) / np.sqrt(1.0025))
    assert (cosines[:4] > 0.98).all() and keep.tolist() == [True] * 4 + [False]
    assert direction_screen(weak, 0.0)[0].all()


def _slow_screen(updates, min_cosine, relative=0.0):
    """The reference: the median and each cosine by plain Python loops."""
    rows = [[float(v) for v in row] for row in updates]
    median = []
    for j in range(len(rows[0])):
        column = sorted(row[j] for row in rows)
        mid = len(column) // 2
        median.append(column[mid] if len(column) % 2 else (column[mid - 1] + column[mid]) / 2)
    m_norm = sum(v * v for v in median) ** 0.5
    cosines = []
    for row in rows:
        norm = sum(v * v for v in row) ** 0.5 * m_norm
        cosines.append(0.0 if norm == 0 else max(-1.0, min(1.0, sum(a * b for a, b in zip(row, median)) / norm)))
    ordered = sorted(cosines)
    mid = len(ordered) // 2
    middle = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    threshold = max(min_cosine, relative * middle) if relative > 0 else min_cosine
    keep = [c >= threshold for c in cosines]
    return (keep if any(keep) else [True] * len(keep)), cosines


@pytest.mark.parametrize("seed", range(6))
def test_screen_equals_the_slow_reference_and_its_properties_hold(seed):
    rng = np.random.default_rng(seed)
    honest = rng.normal(size=(int(rng.integers(5, 12)), 7)) + rng.normal(size=7) * 3
    flipped = -honest[: int(rng.integers(1, len(honest) // 2))]
    updates = np.vstack([honest, flipped]).astype(np.float32)
    threshold = float(rng.uniform(-0.5, 0.5))
    keep, cosines = direction_screen(updates, threshold)
    slow_keep, slow_cosines = _slow_screen(updates, threshold)
    np.testing.assert_allclose(cosines, slow_cosines, atol=1e-12)
    assert keep.tolist() == slow_keep
    relative = float(rng.uniform(0.0, 1.0))
    relative_keep, _ = direction_screen(updates, threshold, relative)
    assert relative_keep.tolist() == _slow_screen(updates, threshold, relative)[0]
    if keep.sum() > 0 and relative_keep.sum() > 0:  # a relative line only ever leaves out more
        assert not (relative_keep & ~keep).any()
    # a row scaled by a positive factor keeps its verdict only through its own cosine; the flipped twin of a
    # kept honest row scores its negative while the median stays honest (fewer than half flipped)
    same, _ = direction_screen(updates * np.array([[3.0]] * len(updates), dtype=np.float32), threshold)
    assert same.tolist() == keep.tolist()
    twins = cosines[len(honest):]
    np.testing.assert_allclose(twins, -np.asarray(direction_screen(updates, -1.0)[1][: len(flipped)]), atol=1e-6)
    assert direction_screen(updates, -1.0)[0].all()  # -1 keeps every row


def test_screen_without_a_direction_keeps_every_row():
    zero_median = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.0]])
    keep, cosines = direction_screen(zero_median, 0.5)
    assert keep.all() and (cosines == 0).all()


@pytest.mark.parametrize("min_cosine", [-1.5, 1.01, np.nan])
def test_screen_refuses_a_bad_threshold(min_cosine):
    with pytest.raises(ValueError, match=r"min_cosine must be in \[-1, 1\]"):
        direction_screen(np.ones((2, 2)), min_cosine)


@pytest.mark.parametrize("relative", [-0.1, 1.5, np.nan])
def test_screen_refuses_a_bad_relative_threshold(relative):
    with pytest.raises(ValueError, match=r"relative must be in \[0, 1\]"):
        direction_screen(np.ones((2, 2)), 0.0, relative)


def test_screen_refuses_bad_updates():
    with pytest.raises(ValueError, match="non-empty"):
        direction_screen(np.ones(3), 0.0)
    with pytest.raises(ValueError, match="finite"):
        direction_screen(np.array([[1.0, np.inf], [1.0, 1.0]]), 0.0)


def test_robust_true_is_the_studied_form_and_refuses_a_second_value():
    params = CoalitionParams(robust=True)
    assert (params.update_norm_bound, params.update_min_cosine, params.min_coalition_fraction) == (
        ROBUST_FORM.update_norm_bound, ROBUST_FORM.update_min_cosine, ROBUST_FORM.min_coalition_fraction)
    assert CoalitionParams(robust=True, update_norm_bound=ROBUST_FORM.update_norm_bound) == params
    with pytest.raises(ParamError, match="robust = true sets update_min_cosine to 0; it is also set to 0.5") as error:
        CoalitionParams(robust=True, update_min_cosine=0.5)
    assert error.value.field == "update_min_cosine"
    with pytest.raises(ValueError, match="robust = true sets update_norm_bound"):
        HKFedAvg(robust=True, update_norm_bound=5.0)
    assert HKFedAvg(robust=True).aggregator.params == CoalitionParams(robust=True)
    assert FixedKFedAvg(robust=True).aggregator.params.update_min_cosine == ROBUST_FORM.update_min_cosine


@pytest.mark.parametrize("field, value, message", [("min_coalition_fraction", 1.2, "must be in .0, 1."),
                                                   ("update_min_cosine", -2.0, r"must be in \[-1, 1\]"),
                                                   ("update_relative_cosine", 1.5, r"must be in \[0, 1\]"),
                                                   ("update_relative_cosine", -0.5, r"must be in \[0, 1\]"),
                                                   ("update_norm_bound", -2.0, "0 .off. or a finite number"),
                                                   ("update_norm_bound", float("nan"), "finite number")])
def test_params_name_the_field(field, value, message):
    with pytest.raises(ParamError, match=message) as error:
        CoalitionParams(**{field: value})
    assert error.value.field == field

# ------------------------------------------------------------------ the aggregator with real Messages


def vector(values):
    return ArrayRecord({"w": Array(np.asarray(values, dtype=np.float32))})


def aggregate(strategy, replies, sent, server_round=1):
    nodes = tuple(r.metadata.src_node_id for r in replies)
    return strategy.aggregate_train_round(TrainRound(server_round, nodes, {n: sent for n in nodes}, ConfigRecord(), ()),
                                          replies)[0]["w"].numpy()


def honest_and_attackers(honest, attackers, attack, seed=0):
    """Replies of ``honest`` clients near the true update (1, 0.5, -1) and ``attackers`` sending ``attack(truth)``."""
    rng = np.random.default_rng(seed)
    truth = np.array([1.0, 0.5, -1.0])
    replies = [reply(i + 1, vector(truth + 0.1 * rng.normal(size=3))) for i in range(honest)]
    replies += [reply(100 + i, vector(attack(truth))) for i in range(attackers)]
    return replies, truth


def cosine(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_two_sign_flippers_of_twelve_hijack_the_paper_rule_not_the_min_fraction():
    replies, truth = honest_and_attackers(10, 2, lambda t: -5 * t)
    sent = vector(np.zeros(3))
    paper = aggregate(HKFedAvg(geometry="cosine", tau=0.5), replies, sent)
    assert cosine(paper, truth) < -0.9  # the attackers' coalition gets half of the model
    recorder = ListRecorder()
    robust = aggregate(HKFedAvg(geometry="cosine", tau=0.5, min_coalition_fraction=0.25, recorder=recorder),
                       replies, sent)
    assert cosine(robust, truth) > 0.99
    assert recorder.rounds[-1][2]["left-out"] == 2


def test_a_scaled_client_is_clipped_to_the_bound():
    # 30x: within the screen's limit (50x the round's lower median update norm), so it reaches the rule
    replies, truth = honest_and_attackers(19, 1, lambda t: 30 * t)
    sent = vector([0.5, 0.5, 0.5])  # updates are w - sent
    replies = [reply(r.metadata.src_node_id, vector(r.content["arrays"]["w"].numpy() + 0.5)) for r in replies]
    paper = aggregate(HKFedAvg(geometry="cosine", tau=0.5, opinion_space="updates"), replies, sent) - 0.5
    assert np.linalg.norm(paper) > 2 * np.linalg.norm(truth)  # joins the main coalition, inflates its barycenter
    recorder = ListRecorder()
    robust = aggregate(HKFedAvg(geometry="cosine", tau=0.5, opinion_space="updates", update_norm_bound=2.0,
                                recorder=recorder), replies, sent) - 0.5
    assert np.linalg.norm(robust) < 1.1 * np.linalg.norm(truth) and cosine(robust, truth) > 0.99
    logged = recorder.rounds[-1][2]
    assert logged["clipped"] == 1 and logged["clipped-nodes"] == [100]


def test_sign_flippers_in_weight_space_join_the_coalition_but_not_past_the_screen():
    # 4 of 20 flip their update: in weight space (a common model far from 0) every model is within cosine
    # 0.99 of the others, so the paper's rule keeps them in the one coalition; the screen leaves them out
    rng = np.random.default_rng(3)
    sent = rng.normal(size=3) * 20
    truth = np.array([1.0, 0.5, -1.0])
    honest = [reply(i + 1, vector(sent + truth + 0.3 * rng.normal(size=3))) for i in range(16)]
    flipped = [reply(100 + i, vector(sent - truth - 0.3 * rng.normal(size=3))) for i in range(4)]
    replies = honest + flipped
    paper = aggregate(HKFedAvg(geometry="cosine", tau=0.75), replies, vector(sent)) - sent
    recorder = ListRecorder()
    screened = aggregate(HKFedAvg(geometry="cosine", tau=0.75, update_min_cosine=0.0, recorder=recorder), replies,
                         vector(sent)) - sent
    honest_mean = np.mean([r.content["arrays"]["w"].numpy() for r in honest], axis=0) - sent
    assert np.linalg.norm(paper - honest_mean) > 0.3 * np.linalg.norm(truth)  # the flips pull the mean back
    np.testing.assert_allclose(screened, honest_mean, atol=1e-4)
    logged = recorder.rounds[-1][2]
    assert logged["screened"] == 4 and logged["screened-nodes"] == [100, 101, 102, 103]
    assert logged["coalitions"] == 1


def test_weakly_aligned_replies_pass_the_fixed_screen_but_not_the_relative_one():
    # label flips, in miniature: 4 of 20 updates keep a small positive cosine with the honest direction, the
    # 16 honest ones agree closely; the fixed line at 0 keeps all, the relative one (0.5 x the median) not them
    rng = np.random.default_rng(5)
    sent = rng.normal(size=4) * 20
    truth = np.array([1.0, 0.5, -1.0, 0.2])
    other = np.array([0.5, -1.0, 0.0, 0.0])  # orthogonal to truth
    honest = [reply(i + 1, vector(sent + truth + 0.2 * rng.normal(size=4))) for i in range(16)]
    weak = [reply(100 + i, vector(sent + 0.15 * truth + other + 0.05 * rng.normal(size=4))) for i in range(4)]
    fixed, relative = ListRecorder(), ListRecorder()
    aggregate(HKFedAvg(geometry="cosine", tau=0.75, robust=True, recorder=fixed), honest + weak, vector(sent))
    combined = aggregate(HKFedAvg(geometry="cosine", tau=0.75, robust=True, update_relative_cosine=0.5,
                                  recorder=relative), honest + weak, vector(sent)) - sent
    assert fixed.rounds[-1][2]["screened"] == 0
    assert relative.rounds[-1][2]["screened-nodes"] == [100, 101, 102, 103]
    honest_mean = np.mean([r.content["arrays"]["w"].numpy() for r in honest], axis=0) - sent
    np.testing.assert_allclose(combined, honest_mean, atol=1e-4)
    assert FixedKFedAvg(update_relative_cosine=0.5).aggregator.params.update_relative_cosine == 0.5


def test_defaults_are_the_papers_rule_bit_for_bit():
    rng = np.random.default_rng(11)
    rows = rng.normal(size=(9, 5)).astype(np.float32)
    replies = [reply(i + 1, vector(row)) for i, row in enumerate(rows)]
    expected, _ = hk_aggregate(rows, HKParams(geometry="cosine", tau=0.3))
    for strategy in (HKFedAvg(geometry="cosine", tau=0.3),
                     HKFedAvg(geometry="cosine", tau=0.3, min_coalition_fraction=0.0, update_norm_bound=0.0,
                              update_min_cosine=-1.0)):
        np.testing.assert_array_equal(aggregate(strategy, replies, vector(np.zeros(5))), expected)


def test_left_out_coalitions_keep_their_own_personal_model():
    replies, truth = honest_and_attackers(10, 2, lambda t: -5 * t)
    strategy = HKFedAvg(geometry="cosine", tau=0.5, min_coalition_fraction=0.25, coalition_models="personal")
    nodes = tuple(r.metadata.src_node_id for r in replies)
    round_ = TrainRound(1, nodes, {n: vector(np.zeros(3)) for n in nodes}, ConfigRecord(), ())
    strategy.aggregate_train_round(round_, replies)
    served = strategy.models.arrays_for(100)["w"].numpy()
    np.testing.assert_allclose(served, -5 * truth, rtol=1e-6)  # the attackers' barycenter, not the shared one
    assert cosine(strategy.models.arrays_for(1)["w"].numpy(), truth) > 0.99


def test_fixed_k_takes_the_same_options():
    replies, truth = honest_and_attackers(10, 2, lambda t: -5 * t)
    robust = aggregate(FixedKFedAvg(k=2, geometry="cosine", min_coalition_fraction=0.25), replies, vector(np.zeros(3)))
    assert cosine(robust, truth) > 0.99

# ------------------------------------------------------------------ the app's run config


def test_run_config_keys_reach_the_aggregator():
    for strategy in ("hk-cosine", "fixed-k-euclidean"):
        config = AppConfig.from_run_config({"strategy": strategy, "coalition-min-fraction": 0.2,
                                            "coalition-update-norm-bound": 3})
        params = build_strategy(config).aggregator.params
        assert (params.min_coalition_fraction, params.update_norm_bound) == (0.2, 3.0)
    config = AppConfig.from_run_config({"strategy": "hk-cosine", "coalition-update-min-cosine": 0.1})
    assert build_strategy(config).aggregator.params.update_min_cosine == 0.1
    both = AppConfig.from_run_config({"strategy": "hk-cosine", "coalition-robust": True,
                                      "coalition-update-relative-cosine": 0.5})
    params = build_strategy(both).aggregator.params
    assert (params.update_min_cosine, params.update_relative_cosine) == (ROBUST_FORM.update_min_cosine, 0.5)
    robust = AppConfig.from_run_config({"strategy": "hk-cosine", "coalition-robust": True})
    assert build_strategy(robust).aggregator.params == CoalitionParams(robust=True)
    assert AppConfig.from_run_config(robust.to_run_config()) == robust  # what config.json holds reads back


@pytest.mark.parametrize("run_config, key, message", [
    ({"coalition-min-fraction": 2.0}, "coalition-min-fraction", "must be in"),
    ({"coalition-update-norm-bound": -1.0}, "coalition-update-norm-bound", "finite number > 0"),
    ({"strategy": "fedavg", "coalition-update-norm-bound": 2.0}, "coalition-update-norm-bound", "forms no coalitions"),
    ({"strategy": "ifca", "coalition-min-fraction": 0.1}, "coalition-min-fraction", "forms no coalitions"),
    ({"strategy": "fedavg", "coalition-update-min-cosine": 0.0}, "coalition-update-min-cosine",
     "forms no coalitions"),
    ({"strategy": "krum", "coalition-robust": True}, "coalition-robust", "forms no coalitions"),
    ({"coalition-update-min-cosine": 1.5}, "coalition-update-min-cosine", "must be in"),
    ({"coalition-update-relative-cosine": 2.0}, "coalition-update-relative-cosine", "must be in"),
    ({"strategy": "fedavg", "coalition-update-relative-cosine": 0.5}, "coalition-update-relative-cosine",
     "forms no coalitions"),
    ({"coalition-robust": True, "coalition-update-norm-bound": 4.0}, "coalition-update-norm-bound",
     "robust = true sets"),
])
def test_bad_robust_keys_name_the_key(run_config, key, message):
    with pytest.raises(ConfigError, match=message) as error:
        AppConfig.from_run_config(run_config)
    assert f"run-config {key!r}" in str(error.value)

# ------------------------------------------------------------------ Flower's robust rules as a part


def _flower_replies(rows, examples):
    return [reply(i + 1, ArrayRecord({"w": Array(np.asarray(r[:3], dtype=np.float32)),
                                      "b": Array(np.asarray(r[3:], dtype=np.float32))}), examples=e)
            for i, (r, e) in enumerate(zip(rows, examples))]


@pytest.mark.parametrize("rule, params, flower", [
    ("krum", RobustRuleParams(num_malicious_nodes=2), lambda: Krum(num_malicious_nodes=2)),
    ("multikrum", RobustRuleParams(num_malicious_nodes=2, num_nodes_to_select=4),
     lambda: MultiKrum(num_malicious_nodes=2, num_nodes_to_select=4)),
    ("bulyan", RobustRuleParams(num_malicious_nodes=2), lambda: Bulyan(num_malicious_nodes=2)),
    ("fedmedian", RobustRuleParams(), FedMedian),
    ("fedtrimmedavg", RobustRuleParams(trim_beta=0.2), lambda: FedTrimmedAvg(beta=0.2)),
])
def test_each_rule_is_flowers_aggregate_train_bit_for_bit(rule, params, flower):
    rng = np.random.default_rng(5)
    rows = rng.normal(size=(11, 5))
    rows[:2] *= -20  # two outliers
    examples = rng.integers(5, 50, size=11).tolist()
    expected, _ = flower().aggregate_train(1, _flower_replies(rows, examples))
    strategy = BouquetStrategy(sampler=UniformSampler(SamplingParams()), aggregator=FlowerRobustRule(rule, params))
    nodes = tuple(range(1, 12))
    sent = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32)), "b": Array(np.zeros(2, dtype=np.float32))})
    ours, _ = strategy.aggregate_train_round(TrainRound(1, nodes, {n: sent for n in nodes}, ConfigRecord(), ()),
                                             _flower_replies(rows, examples))
    for key in ("w", "b"):
        np.testing.assert_array_equal(ours[key].numpy(), expected[key].numpy())


def test_krum_keeps_the_honest_and_reports_whom():
    replies, truth = honest_and_attackers(10, 2, lambda t: -5 * t)
    recorder = ListRecorder()
    strategy = robust_strategy("krum", RobustRuleParams(num_malicious_nodes=2), SamplingParams(), recorder=recorder)
    result = aggregate(strategy, replies, vector(np.zeros(3)))
    assert cosine(result, truth) > 0.99
    (selected,) = [r[2]["robust-selected"] for r in recorder.rounds]
    assert len(selected) == 1 and selected[0] < 100


def test_too_few_replies_keep_the_model_with_a_warning(caplog):
    replies, _ = honest_and_attackers(5, 0, None)
    strategy = BouquetStrategy(sampler=UniformSampler(SamplingParams()),
                               aggregator=FlowerRobustRule("bulyan", RobustRuleParams(num_malicious_nodes=1)),
                               models=SharedModel(vector([7.0, 8.0, 9.0])))
    nodes = tuple(r.metadata.src_node_id for r in replies)
    with caplog.at_level("WARNING"):
        arrays, _ = strategy.aggregate_train_round(
            TrainRound(1, nodes, {n: vector(np.zeros(3)) for n in nodes}, ConfigRecord(), ()), replies)
    assert "Flower Bulyan needs at least 7 replies" in caplog.text
    np.testing.assert_array_equal(arrays["w"].numpy(), [7.0, 8.0, 9.0])  # the shared model, unchanged


def test_rule_names_and_params_are_validated():
    with pytest.raises(ParamError, match="rule must be one of"):
        FlowerRobustRule("median")
    with pytest.raises(ParamError, match="trim_beta"):
        RobustRuleParams(trim_beta=0.5)
    with pytest.raises(ParamError, match="num_malicious_nodes"):
        RobustRuleParams(num_malicious_nodes=-1)


@pytest.mark.parametrize("run_config, key, message", [
    ({"strategy": "bulyan", "robust-num-malicious-nodes": 3, "clients-per-round": 11}, "robust-num-malicious-nodes",
     "needs at least 15 clients per round"),
    ({"strategy": "multikrum", "robust-num-nodes-to-select": 20, "clients-per-round": 11},
     "robust-num-nodes-to-select", "needs at least 20"),
    ({"strategy": "fedtrimmedavg", "robust-trim-beta": 0.5}, "robust-trim-beta", "must be in"),
    ({"strategy": "fedavg", "robust-trim-beta": 0.3}, "robust-trim-beta", "is not one of Flower's robust rules"),
    ({"strategy": "krum", "coalition-models": "personal"}, "coalition-models", "forms no coalitions"),
])
def test_bad_robust_rule_keys_name_the_key(run_config, key, message):
    with pytest.raises(ConfigError, match=message) as error:
        AppConfig.from_run_config(run_config)
    assert f"run-config {key!r}" in str(error.value)


def test_the_app_builds_each_rule_behind_its_seeded_sampler():
    for rule in ROBUST_RULES:
        config = AppConfig.from_run_config({"strategy": rule, "robust-num-malicious-nodes": 1})
        strategy = build_strategy(config)
        assert isinstance(strategy.aggregator, FlowerRobustRule) and strategy.aggregator.rule == rule
        assert strategy.aggregator.params.num_malicious_nodes == 1
