"""End to end: attacked runs with Flower's robust rules and HK's robust options, as a user runs them (real flwr)."""

import pytest

from bouquet.algorithms.attacks import attackers
from bouquet.results import RunFolder

pytestmark = pytest.mark.e2e

WATER = ('synthetic-households=5 active-factor=0 local-epochs=1 num-server-rounds=2 clients-per-round=5 '
         'fraction-evaluate=1.0')
DIGITS = ('task="vision" vision-partitioner="iid" vision-evaluation="clients" vision-client-test-size=30 '
          'local-batches=2 num-server-rounds=1 clients-per-round=5')


def test_water_sign_flippers_against_multikrum(run_app):
    folder, stdout = run_app(f'{WATER} strategy="multikrum" robust-num-malicious-nodes=1 '
                             'robust-num-nodes-to-select=2 attack="sign-flip" attack-fraction=0.4', supernodes=5)
    run = RunFolder(folder)
    assert "Aggregation: Flower MultiKrum (Flower's rule, f=1, m=2)" in stdout
    assert "Attack: sign-flip, 40% of the partitions, s=1 (sent by the clients)" in stdout
    train = run.rounds("train")
    assert [len(r["robust-selected"]) for r in train] == [2, 2] and [r["attackers"] for r in train] == [2, 2]
    summary = run.summary()
    assert summary["attackers"] == sorted(attackers(5, 0.4, seed=0)) and summary["attack"] == "sign-flip"
    assert summary["mae-litres-honest-mean"] > 0
    clients = run.table("clients")
    assert sorted(clients.loc[clients["attacker"].astype(bool), "partition-id"]) == summary["attackers"]


def test_digits_alie_against_hk_with_its_robust_options(run_app):
    folder, stdout = run_app(f'{DIGITS} strategy="hk-cosine" hk-opinion-space="updates" hk-tau=0.5 '
                             'coalition-update-norm-bound=1.0 coalition-min-fraction=0.3 '
                             'attack="alie" attack-fraction=0.2', supernodes=5)
    run = RunFolder(folder)
    (train,) = run.rounds("train")
    # a bound of 1 x the median clips every update above the median: 2 of 5 when the norms differ
    assert train["clipped"] == len(train["clipped-nodes"]) == 2 and 0 <= train["left-out"] < 5
    assert train["attackers"] == 1
    assert "forged by the server from the honest updates" in stdout
    summary = run.summary()
    assert len(summary["attackers"]) == 1 and 0 <= summary["accuracy-honest-mean"] <= 1


def test_digits_sign_flippers_left_out_by_the_robust_form(run_app):
    # 10 local batches: early updates with a common direction (after 2 batches from the initial model they are
    # mostly noise, and two flipped ones of five shape the median themselves)
    digits = DIGITS.replace("local-batches=2", "local-batches=10")
    folder, stdout = run_app(f'{digits} strategy="hk-cosine" coalition-robust=true attack="sign-flip" '
                             'attack-fraction=0.4', supernodes=5)
    run = RunFolder(folder)
    assert "updates with a cosine under 0 with the median update left out" in stdout
    (train,) = run.rounds("train")
    # the direction screen leaves out exactly the two flipped updates; what is left is one coalition
    assert sorted(train["screened-nodes"]) == sorted(train["attacker-nodes"]) and train["screened"] == 2
    assert abs(train["attacker-share"]) < 1e-3 and train["coalitions"] == 1
    assert json_config(folder)["coalition-robust"] is True


def json_config(folder):
    import json

    return json.loads((folder / "config.json").read_text())
