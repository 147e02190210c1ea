"""End to end: Flower's robust rules and HK's robust options as a user runs them (real flwr runs)."""

import pytest

from bouquet.results import RunFolder

pytestmark = pytest.mark.e2e

SMALL = ('synthetic-households=5 active-factor=0 local-epochs=1 num-server-rounds=2 clients-per-round=5 '
         'fraction-evaluate=1.0')


def test_multikrum_behind_the_seeded_sampler(run_app):
    folder, stdout = run_app(f'{SMALL} strategy="multikrum" robust-num-malicious-nodes=1 '
                             'robust-num-nodes-to-select=2', supernodes=5)
    run = RunFolder(folder)
    assert "Aggregation: Flower MultiKrum (Flower's rule, f=1, m=2)" in stdout
    train = run.rounds("train")
    assert [len(r["robust-selected"]) for r in train] == [2, 2]
    assert run.summary()["clients-evaluated"] == 5


def test_hk_with_clipping_and_a_minimum_coalition_size(run_app):
    folder, stdout = run_app(f'{SMALL} strategy="hk-cosine" hk-opinion-space="updates" hk-tau=0.5 '
                             'hk-update-norm-bound=1.0 hk-min-coalition-fraction=0.3', supernodes=5)
    train = RunFolder(folder).rounds("train")
    # a bound of 1 x the median clips every update above the median: 2 of 5 when the norms differ
    assert all(r["clipped"] == len(r["clipped-nodes"]) == 2 for r in train)
    assert all(0 <= r["left-out"] < 5 for r in train)
    assert "updates clipped at 1 x the median norm" in stdout
