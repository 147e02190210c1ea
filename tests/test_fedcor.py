"""FedCor's GP as its official code fits and uses it: the closed-form fit against the Adam reference, hand cases
of the greedy selection, and the selector's ``gp`` mode (warm-up, fit schedule, annealing, checkpoint round trip)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bouquet.algorithms.fedcor import (
    fit_gp_covariance,
    fit_gp_covariance_reference,
    gp_greedy_selection,
    gp_log_likelihood,
    weighted_mean_changes,
)
from bouquet.algorithms.selection import Candidates, FedCorSelector
from bouquet.config import AppConfig, ConfigError


def test_closed_form_fit_by_hand():
    # two clients that always move together by +-1: mean 0, scatter [[1, 1], [1, 1]], eigenvalues 2 and 0
    changes = np.array([[1.0, 1.0], [-1.0, -1.0]])
    mu, k = fit_gp_covariance(changes, np.ones(2), dimension=1, noise=0.1)
    assert mu == pytest.approx([0.0, 0.0])
    # K = 2 v v^T + 0.01 u u^T with v = (1, 1)/sqrt 2, u = (1, -1)/sqrt 2
    assert k == pytest.approx(np.array([[1.005, 0.995], [0.995, 1.005]]))
    # weights: the mean is the weighted mean (the official MLE_Mean with gamma^age)
    assert weighted_mean_changes(np.array([[1.0, 0.0], [3.0, 2.0]]), np.array([1.0, 3.0])) == pytest.approx([2.5, 1.5])


@pytest.mark.parametrize("dimension", [1, 2, 5])
def test_closed_form_fit_reaches_the_likelihood_of_the_official_adam_fit(dimension):
    rng = np.random.default_rng(3)
    mixing = rng.standard_normal((5, 5)) * 0.05
    changes = rng.standard_normal((40, 5)) @ mixing - 0.02
    weights = 0.95 ** np.arange(40)[::-1]
    mu, k = fit_gp_covariance(changes, weights, dimension, noise=0.01)
    mu_ref, k_ref = fit_gp_covariance_reference(changes, weights, dimension, noise=0.01, steps=4000)
    assert mu == pytest.approx(mu_ref)
    fast, slow = gp_log_likelihood(k, changes, weights, mu), gp_log_likelihood(k_ref, changes, weights, mu)
    assert fast >= slow - 1e-6  # the closed form is the maximum ...
    assert fast - slow < 1e-3 * abs(fast)  # ... and the official ascent gets there
    assert np.abs(k - k_ref).max() < 0.02 * np.abs(k).max()
    # a maximum: moving K along any rank-respecting direction lowers the likelihood
    values, vectors = np.linalg.eigh(k)
    for scale in (0.9, 1.1):
        nudged = (vectors * np.where(values > 0.01 ** 2 + 1e-12, values * scale, values)) @ vectors.T
        assert gp_log_likelihood(nudged, changes, weights, mu) < fast
    # the rank of K - noise^2 I is at most D
    assert np.sum(np.linalg.eigvalsh(k) > 0.01 ** 2 * (1 + 1e-9)) <= dimension


def test_greedy_selection_by_hand():
    sigma = np.array([[1.0, 0.9, 0.0], [0.9, 1.0, 0.0], [0.0, 0.0, 1.0]])
    w = np.full(3, 1 / 3)
    # scores: 1.9/3, 1.9/3, 1/3 -> client 0; then Sigma_11 = 0.19, Sigma_22 = 1 -> sqrt(.19)/3 < 1/3 -> client 2
    assert gp_greedy_selection(sigma, w, 2) == [0, 2]
    # annealing client 2 to 0.3: 0.3/3 < sqrt(0.19)/3 -> its correlated partner 1 instead
    assert gp_greedy_selection(sigma, w, 2, discount=np.array([1.0, 1.0, 0.3])) == [0, 1]
    # a common scale of the covariance changes nothing; picks are distinct
    assert gp_greedy_selection(7.0 * sigma, w, 3) == [0, 2, 1]
    with pytest.raises(ValueError, match="budget"):
        gp_greedy_selection(sigma, w, 4)
    with pytest.raises(ValueError, match="finite"):
        fit_gp_covariance(np.array([[np.nan, 1.0], [0.0, 1.0]]), np.ones(2))


def _round(sel, state, ids, losses, trained):
    cands = Candidates(ids=ids, losses=np.asarray(losses, dtype=float), num_examples=np.full(len(ids), 100.0),
                       last_round=np.asarray(trained))
    return sel.observe(state, cands), cands


def test_gp_mode_warms_up_fits_on_schedule_and_anneals_the_selected():
    sel = FedCorSelector(covariance="gp", warmup=3, interval=4, discount=0.5, gamma=0.9, dimension=2)
    ids = [10, 11, 12, 13]
    rng = np.random.default_rng(0)
    moves = np.random.default_rng(1).standard_normal((12, 2)) * 0.2
    state, trained = sel.initial_state(), [-1, -1, -1, -1]
    fits = []
    for t in range(12):
        losses = 2.0 + np.array([moves[t, 0], moves[t, 0], moves[t, 1], moves[t, 1]]) * (t + 1)
        state, cands = _round(sel, state, ids, losses, trained)
        fits.append(state.fit_round)
        choice = sel.select(cands, 1, rng, state)
        assert choice.report["fedcor-warmup"] == (t < 3)
        picked = ids[int(choice.indices[0])]
        trained = [t if i == picked else r for i, r in zip(ids, trained)]
    # fitted when the warm-up ends (4th observation) and then every 4 rounds
    assert fits == [-1, -1, -1, 4, 4, 4, 4, 8, 8, 8, 8, 12]
    assert state.discount == {}  # reset by the fit in round 12
    # a client seen to have trained since the last look is annealed once per selection
    later = [state.trained[i] for i in ids]
    later[1], later[3] = 12, 13  # 11 and 13 trained since
    state2, _ = _round(sel, state, ids, [2.0] * 4, later)
    assert state2.discount == {11: 0.5, 13: 0.5}
    state3, _ = _round(sel, state2, ids, [2.0] * 4, [*later[:3], 14])
    assert state3.discount == {11: 0.5, 13: 0.25}
    # the fitted covariance follows the correlation: 10 with 11 and 12 with 13
    cov = sel.covariance_matrix(state, ids)
    corr = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    assert corr[0, 1] > 0.9 and corr[2, 3] > 0.9 and abs(corr[0, 2]) < corr[0, 1]
    # a client the fit did not know: the fit's mean variance, no covariance
    extra = sel.covariance_matrix(state, [10, 99])
    assert extra[0, 1] == 0 and extra[1, 1] == pytest.approx(np.mean(np.diag(cov)))
    # the state survives a JSON trip (a checkpoint), huge node ids included
    big = sel.observe(state2, Candidates(ids=[2**64 - 1, 10], losses=np.ones(2), last_round=np.array([3, 13])))
    again = sel.state_from_dict(json.loads(json.dumps(sel.state_to_dict(big))))
    assert again == big


def test_fedcor_keys_are_checked_and_named():
    config = AppConfig.from_run_config({"task": "vision", "selection": "fedcor", "fedcor-covariance": "gp",
                                        "fedcor-history": 500, "fedcor-interval": 50})
    assert config.fedcor.covariance == "gp" and config.fedcor.history == 500
    for key, value in (("fedcor-covariance", "kernel"), ("fedcor-gamma", 0.0), ("fedcor-discount", 1.5),
                       ("fedcor-dimension", 0), ("fedcor-history", 1)):
        with pytest.raises(ConfigError, match=key):
            AppConfig.from_run_config({"task": "vision", "selection": "fedcor", key: value})
