"""Secure sums by pairwise masks (bouquet.algorithms.masking): the masks cancel in the sum and only there, fixed
point keeps the sums, and bad input is refused."""

import numpy as np
import pytest

from bouquet.algorithms.masking import (
    FRACTION_BITS,
    add_masked,
    mask,
    new_private_key,
    pair_seeds,
    public_key,
    unmask,
)


def parties(n):
    keys = [new_private_key() for _ in range(n)]
    publics = [public_key(k) for k in keys]
    return keys, publics, [pair_seeds(k, i, publics) for i, k in enumerate(keys)]


def test_two_parties_share_one_seed_and_their_masks_cancel():
    _, _, seeds = parties(2)
    assert seeds[0][1] == seeds[1][0] and seeds[0][0] is None and len(seeds[0][1]) == 32
    zero = {"x": np.zeros(5)}
    a, b = mask(zero, seeds[0], 0, step=3), mask(zero, seeds[1], 1, step=3)
    assert (a["x"] != 0).all() and (a["x"] + b["x"] == 0).all()  # +m and -m, modulo 2**64
    assert not np.array_equal(mask(zero, seeds[0], 0, step=4)["x"], a["x"])  # a new mask each exchange


def test_the_server_gets_the_sum_and_a_party_s_array_looks_like_noise():
    _, _, seeds = parties(5)
    rng = np.random.default_rng(0)
    values = [{"h": rng.normal(0, 50, size=(4, 3, 2)), "n": rng.integers(0, 30, size=7).astype(float)}
              for _ in range(5)]
    masked = [mask(v, seeds[i], i, step=1) for i, v in enumerate(values)]
    total = unmask(add_masked(masked))
    np.testing.assert_allclose(total["h"], sum(v["h"] for v in values), atol=5 * 2.0 ** -FRACTION_BITS)
    np.testing.assert_array_equal(total["n"], sum(v["n"] for v in values))  # counts are exact
    alone = unmask(masked[0])["h"]
    assert np.abs(alone - values[0]["h"]).min() > 1e3  # one party's array, unmasked alone, says nothing
    bits = np.unpackbits(masked[0]["n"].view(np.uint8))
    assert 0.4 < bits.mean() < 0.6  # uniform-looking words
    missing = unmask(add_masked(masked[:4]))["n"]  # a party short: the masks do not cancel
    assert not np.allclose(missing, sum(v["n"] for v in values[:4]))


def test_bad_input_is_refused():
    keys, publics, _ = parties(3)
    with pytest.raises(ValueError, match="not among"):
        pair_seeds(keys[0], 3, publics)
    with pytest.raises(ValueError, match="not its own"):
        pair_seeds(keys[0], 1, publics)
    seeds = pair_seeds(keys[0], 0, publics)
    with pytest.raises(ValueError, match="too large"):
        mask({"x": np.array([1e20])}, seeds, 0, 1)
    with pytest.raises(ValueError, match="too large"):
        mask({"x": np.array([np.nan])}, seeds, 0, 1)
