"""The protocol's arithmetic by hand: grids, the choice on validation (never on test), paired t intervals."""

import math

import numpy as np
import pandas as pd
import pytest

from bouquet.tuning import candidate_name, choose_on_validation, expand_grid, paired_interval, sample_std


def test_expand_grid_names_every_combination_in_order():
    out = expand_grid("fedavg", {"strategy": "fedavg"}, {"learning-rate": [0.003, 0.01], "personalize-epochs": [0, 5]})
    assert [c.name for c in out] == [
        "fedavg[learning-rate=0.003,personalize-epochs=0]", "fedavg[learning-rate=0.003,personalize-epochs=5]",
        "fedavg[learning-rate=0.01,personalize-epochs=0]", "fedavg[learning-rate=0.01,personalize-epochs=5]"]
    assert out[2].run_config == {"strategy": "fedavg", "learning-rate": 0.01, "personalize-epochs": 0}
    assert [c.name for c in expand_grid("local", {"strategy": "local"}, {})] == ["local"]
    assert candidate_name("a", {}) == "a"
    with pytest.raises(ValueError, match="both a fixed key and a grid key"):
        expand_grid("x", {"seed": 1}, {"seed": [1, 2]})
    with pytest.raises(ValueError, match="non-empty list"):
        expand_grid("x", {}, {"seed": []})
    with pytest.raises(ValueError, match="non-empty list"):
        expand_grid("x", {}, {"strategy": "fedavg"})


def test_choose_on_validation_reads_validation_only():
    frame = pd.DataFrame([
        {"arm": "a", "candidate": "a[1]", "seed": 0, "val-mae": 5.0, "test-mae": 1.0},
        {"arm": "a", "candidate": "a[1]", "seed": 1, "val-mae": 7.0, "test-mae": 1.0},
        {"arm": "a", "candidate": "a[2]", "seed": 0, "val-mae": 5.5, "test-mae": 9.0},
        {"arm": "a", "candidate": "a[2]", "seed": 1, "val-mae": 6.0, "test-mae": 9.0},
        {"arm": "b", "candidate": "b[1]", "seed": 0, "val-mae": 3.0, "test-mae": 0.0},
        {"arm": "b", "candidate": "b[2]", "seed": 0, "val-mae": 3.0, "test-mae": 9.0},
    ])
    table = choose_on_validation(frame)
    chosen = table.loc[table["chosen"], "candidate"].tolist()
    assert chosen == ["a[2]", "b[1]"]  # a: 5.75 < 6.0 despite a[1]'s test numbers; b: a tie, the first
    row = table.set_index("candidate").loc["a[1]"]
    assert row["val-mae-mean"] == 6.0 and row["val-mae-std"] == pytest.approx(math.sqrt(2.0))  # ddof = 1
    with pytest.raises(ValueError, match="lack tuning seeds"):
        choose_on_validation(frame.drop(index=3))
    with pytest.raises(ValueError, match="no tuning runs"):
        choose_on_validation(frame.iloc[0:0])


def test_paired_interval_by_hand():
    a, b = [10.0, 12.0, 11.0], [11.0, 12.9, 12.1]  # differences -1, -0.9, -1.1: mean -1, s = 0.1
    interval = paired_interval(a, b)
    half = 4.302652729911275 * 0.1 / math.sqrt(3)  # t_{0.975, 2}
    assert interval.mean == pytest.approx(-1.0) and interval.half_width == pytest.approx(half)
    assert interval.excludes_zero and interval.text() == f"-1.00 [{-1 - half:+.2f}, {-1 + half:+.2f}]"
    single = paired_interval([1.0], [2.0])
    assert single.n == 1 and math.isnan(single.half_width) and not single.excludes_zero
    assert not paired_interval([1.0, 2.0], [1.5, 1.5]).excludes_zero
    with pytest.raises(ValueError, match="equally long"):
        paired_interval([1.0, 2.0], [1.0])
    assert sample_std([1.0, 3.0]) == pytest.approx(np.std([1.0, 3.0], ddof=1)) and math.isnan(sample_std([1.0]))
