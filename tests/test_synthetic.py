"""Synthetic Alicante-like generator: determinism, structure, and calibrated statistics."""

import numpy as np
import pytest

from bouquet.data.synthetic import (
    ARCHETYPES,
    SyntheticParams,
    generate_household,
    generate_population,
)
from bouquet.data.water import WaterDataParams, build_pool


def test_same_seed_same_data_other_seed_other_data():
    a, b = generate_household(7), generate_household(7)
    np.testing.assert_array_equal(a.hourly, b.hourly)
    c = generate_household(7, SyntheticParams(seed=1))
    assert not np.array_equal(a.hourly[: len(c.hourly)], c.hourly[: len(a.hourly)])


def test_household_is_independent_of_population_size():
    small = generate_household(3, SyntheticParams(n_households=10))
    large = generate_household(3, SyntheticParams(n_households=1099))
    np.testing.assert_array_equal(small.hourly, large.hourly)


def test_hourly_litres_are_non_negative_integers():
    h = generate_household(11)
    assert (h.hourly >= 0).all()
    np.testing.assert_array_equal(h.hourly, np.round(h.hourly))
    assert h.hourly.shape == (len(h.daily) * 24,)


def test_index_out_of_range():
    with pytest.raises(IndexError, match="outside"):
        generate_household(5, SyntheticParams(n_households=5))


@pytest.fixture(scope="module")
def population():
    return generate_population()


def test_population_statistics_in_documented_ranges(population):
    """Ranges from docs/DATA.md (real 92-household file: mean ~235 L/day, ~51% zero hours)."""
    assert len(population) == 1099
    assert {h.archetype for h in population} <= set(ARCHETYPES)
    residential = [h for h in population if h.archetype not in ("vacant", "non-residential")]
    means = np.array([h.daily.mean() for h in residential])
    assert 200 <= means.mean() <= 270
    assert 190 <= np.median(means) <= 250
    zero_share = np.mean([(h.hourly == 0).mean() for h in residential])
    assert 0.40 <= zero_share <= 0.65
    night = np.mean([h.hourly.reshape(-1, 24)[:, 2:5].mean() for h in residential])
    evening = np.mean([h.hourly.reshape(-1, 24)[:, 20:22].mean() for h in residential])
    assert evening > 5 * night


def test_paper_filters_give_about_the_papers_pool():
    pool = build_pool(WaterDataParams())
    status = pool.report["status"]
    active = (~status.str.startswith("inactive")).sum()
    assert 150 <= active <= 230  # paper: 188
    assert 145 <= len(pool) <= 225  # paper: 184


def test_spikes_exist_somewhere(population):
    daily_max = max(h.daily.max() for h in population if h.archetype != "non-residential")
    assert daily_max >= 800
