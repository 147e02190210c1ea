"""bouquet.forecasting.combine (never worse than naive on validation) and bouquet.forecasting.evaluation (MASE,
households as the replicate, Diebold-Mariano): hand cases, properties, bad input."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bouquet.forecasting.combine import (
    COMBINATION_WEIGHTS,
    FallbackParams,
    best_baseline,
    choose_rule,
    choose_weight,
    combine,
    pooled_weight,
    share_errors,
)
from bouquet.forecasting.evaluation import diebold_mariano, dm_shares, household_bootstrap, mase_scale


def test_choose_weight_hand_cases():
    actual = np.array([10.0, 20, 30, 40])
    model = actual + np.array([2.0, -2, 2, -2])  # off by 2
    baseline = actual - np.array([2.0, -2, 2, -2])  # off by 2 the other way: the average is exact
    assert choose_weight(model, baseline, actual, FallbackParams("combine")) == 0.5
    assert choose_weight(model, baseline, actual, FallbackParams("none")) == 1.0
    assert choose_weight(model, baseline, actual, FallbackParams("select")) == 0.0  # a tie goes to the baseline
    better = actual + 1
    assert choose_weight(better, baseline, actual, FallbackParams("select")) == 1.0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 500), st.floats(0, 500), st.floats(0, 500)), min_size=1, max_size=30),
       st.sampled_from(["select", "combine"]))
def test_the_chosen_share_is_never_worse_than_the_baseline_on_its_own_days(rows, rule):
    model, baseline, actual = (np.array(c) for c in zip(*rows))
    w = choose_weight(model, baseline, actual, FallbackParams(rule))
    served = combine(model, baseline, w)
    assert np.mean(np.abs(served - actual)) <= np.mean(np.abs(np.maximum(baseline, 0) - actual)) + 1e-9
    assert np.mean(np.abs(served - actual)) <= np.mean(np.abs(np.maximum(model, 0) - actual)) + 1e-9


def test_combine_clips_and_reads_one_side_at_the_ends():
    np.testing.assert_allclose(combine([-5.0, 10], [1.0, 1], 1.0), [0, 10])
    np.testing.assert_allclose(combine([np.nan, 10], [1.0, 2], 0.0), [1, 2])  # the model's NaN is not read
    np.testing.assert_allclose(combine([4.0], [2.0], 0.25), [2.5])
    with pytest.raises(ValueError, match="weight must be in"):
        combine([1.0], [1.0], 1.5)


def test_bad_input():
    with pytest.raises(ValueError, match="fallback must be one of none, select, combine, pooled"):
        FallbackParams("always")
    with pytest.raises(ValueError, match="pooled share"):
        FallbackParams("pooled", share=0.3)
    with pytest.raises(ValueError, match="one row of 5"):
        pooled_weight([[1.0, 2.0]])
    with pytest.raises(ValueError, match="two validation days"):
        choose_rule([(np.array([1.0]), {"a": np.array([1.0])}, np.array([1.0]))])
    with pytest.raises(ValueError, match="none has an actual"):
        choose_weight([1.0], [1.0], [np.nan], FallbackParams("combine"))
    with pytest.raises(ValueError, match="equally long"):
        choose_weight([1.0, 2], [1.0], [1.0], FallbackParams("combine"))
    assert best_baseline({"a": [1.0, 5], "b": [2.0, 2]}, [2.0, 2]) == "b"
    with pytest.raises(ValueError, match="no forecasters"):
        best_baseline({}, [1.0])


def test_mase_scale():
    y = np.array([1.0, 2, 3, 4, 5, 6, 7, 3, 2, 3, 4, 5, 6, 7, 100])
    # pairs (t, t-7) with t < 14: t = 7..13: |3-1|, |2-2|, |3-3|, |4-4|, |5-5|, |6-6|, |7-7| -> 2/7
    assert mase_scale(y, 14) == pytest.approx(2 / 7)
    assert math.isnan(mase_scale(y, 7))


def test_bootstrap_hand_case_and_pairing():
    a = np.array([90.0, 90, 45, 45])
    b = np.array([100.0, 100, 50, 50])
    homes = np.array(["x", "x", "y", "y"])
    result = household_bootstrap(a, b, homes, resamples=500)
    assert result.gain == pytest.approx(0.1) and result.households == 2
    # every household's a is exactly 0.9 of its b: every resample gives the same gain
    assert result.gain_low == pytest.approx(0.1) and result.gain_high == pytest.approx(0.1)
    assert result.excludes_zero and result.text() == "+10.0 % [+10.0, +10.0]"
    again = household_bootstrap(a, b, homes, resamples=500)
    assert again == result  # seeded
    with pytest.raises(ValueError, match="finite"):
        household_bootstrap([np.nan], [1.0], ["x"])
    with pytest.raises(ValueError, match="equally long"):
        household_bootstrap([1.0], [1.0, 2], ["x"])


def test_bootstrap_interval_widens_with_household_disagreement():
    rng = np.random.default_rng(0)
    b = rng.uniform(50, 150, 40)
    agree = household_bootstrap(0.95 * b, b, np.arange(40))
    noisy = household_bootstrap(b * rng.uniform(0.7, 1.2, 40), b, np.arange(40))
    assert agree.gain_high - agree.gain_low < 1e-9 < noisy.gain_high - noisy.gain_low


def test_diebold_mariano():
    rng = np.random.default_rng(1)
    e_b = rng.normal(0, 10, 200)
    better = diebold_mariano(0.5 * e_b, e_b)
    assert better.p_value < 1e-6 and better.mean_difference < 0 and better.days == 200
    same = diebold_mariano(e_b, e_b)
    assert same.p_value == 1.0 and math.isnan(same.statistic)
    swapped = diebold_mariano(e_b, 0.5 * e_b)
    assert swapped.statistic == pytest.approx(-better.statistic)
    # hand case: d = [1, -1, 1, 1]: mean 0.5, variance 0.75, DM = 0.5 / sqrt(0.75 / 4), HLN factor sqrt((4 - 1) / 4)
    r = diebold_mariano([2.0, 1, 2, 2], [1.0, 2, 1, 1])
    assert r.statistic == pytest.approx(0.5 / math.sqrt(0.75 / 4) * math.sqrt(3 / 4))
    shares = dm_shares([better, same, swapped])
    assert shares == {"better": 1 / 3, "worse": 1 / 3, "neither": 1 / 3, "households": 3}
    with pytest.raises(ValueError, match="horizon"):
        diebold_mariano([1.0], [1.0], horizon=0)


def test_pooled_share_by_hand():
    """Two households: one wants the model, one its baseline; the pool's share minimises the summed MAE."""
    actual = np.array([100.0, 100.0])
    a = share_errors([100.0, 100.0], [140.0, 140.0], actual)  # the model is exact: 0 at w = 1, 40 at w = 0
    b = share_errors([160.0, 160.0], [100.0, 100.0], actual)  # the baseline is exact: 60 at w = 1, 0 at w = 0
    np.testing.assert_allclose(a, [40, 30, 20, 10, 0])
    np.testing.assert_allclose(b, [0, 15, 30, 45, 60])
    assert pooled_weight([a, b]) == 0.0  # sums 40, 45, 50, 55, 60
    assert pooled_weight([a, a, b]) == 1.0  # sums 80, 75, 70, 65, 60
    told = FallbackParams("pooled", share=0.75)
    assert told.weights == (0.75,) and choose_weight([1.0], [5.0], [1.0], told) == 0.75
    assert FallbackParams("pooled").weights == COMBINATION_WEIGHTS  # not told: the node's own combination


def test_the_rule_is_chosen_on_the_second_half_of_each_households_validation_days():
    """A model good on the first half and bad on the second: every rule fitted on the first half trusts it, and
    only the baseline-leaning ones survive the second half; a steady model is served alone."""
    actual = np.full(20, 100.0)
    steady = [(actual + 5, {"blend": actual + 20, "median": actual + 30}, actual) for _ in range(3)]
    rule, scores = choose_rule(steady)
    assert rule == "none" and scores["none"] == pytest.approx(5.0)  # every rule serves the model alone: a tie
    drifting = actual + np.r_[np.full(10, 1.0), np.full(10, 60.0)]
    households = [(drifting, {"blend": actual + 20}, actual)] * 3
    rule, scores = choose_rule(households)
    assert scores["none"] == pytest.approx(60.0) and scores["select"] == pytest.approx(60.0)
    assert rule == "none"  # the first half favours the model under every rule
    mixed = [(actual + np.r_[np.full(10, 30.0), np.full(10, 30.0)], {"blend": actual + 10}, actual)] * 2
    rule, scores = choose_rule(mixed)
    assert rule == "select" and scores["select"] == pytest.approx(10.0) and scores["none"] == pytest.approx(30.0)
    assert scores["combine"] == pytest.approx(10.0)  # a tie with select: the simpler rule, listed first, wins
