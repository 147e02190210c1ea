"""End to end: per-coalition models and the clustered-FL peers as a user runs them (real flwr runs)."""

import numpy as np
import pytest

from bouquet.results import RunFolder

pytestmark = pytest.mark.e2e

TYPED = ('synthetic-households=6 synthetic-types="family,holiday,business" active-factor=0 local-epochs=1 '
         "num-server-rounds=2")
ROTATED = ('task="vision" vision-partitioner="iid" vision-groups="rotate" vision-num-groups=2 '
           'vision-evaluation="clients" vision-client-test-size=40 local-batches=3 num-server-rounds=1')


def test_hk_personal_models_on_household_types(run_app):
    folder, stdout = run_app(f'{TYPED} strategy="hk-cosine" hk-opinion-space="updates" hk-tau=0.5 '
                             'coalition-models="personal" clients-per-round=6', supernodes=6)
    run = RunFolder(folder)
    assert "bouquet summary: hk-cosine, 2 rounds, 6 clients" in stdout
    train = run.rounds("train")
    assert all(0 <= r["coalitions"] <= 6 and -1 <= r["ari"] <= 1 for r in train)
    models = run.table("coalition_models")
    assert set(models["round"]) == {1, 2} and models.groupby("round")["size"].sum().tolist() == [6, 6]
    final = run.table("clients")
    coalitions = run.table("coalitions")
    last = coalitions[coalitions["round"] == 2].set_index("partition-id")["coalition"]
    # every client is evaluated with the barycenter of the coalition it joined in round 2
    assert all(f"r2-c{last[p]}" == m for p, m in zip(final["partition-id"], final["model"]))
    assert set(final["group"]) == {"family", "holiday", "business"}
    assert all(r["models-served"] == len(set(final["model"])) for r in run.rounds("evaluate")[-1:])


@pytest.mark.parametrize("strategy, extra", [
    ("ifca", "ifca-k=2"),
    ("cfl", "cfl-warmup=0 cfl-eps1=1000 cfl-eps2=0.0001"),  # thresholds that split at once, to see a split
])
def test_clustered_peers_on_rotated_digits(run_app, strategy, extra):
    folder, stdout = run_app(f'{ROTATED} strategy="{strategy}" {extra} clients-per-round=4', supernodes=4)
    run = RunFolder(folder)
    summary = run.summary()
    assert summary["clients-evaluated"] == 4 and 0 <= summary["client-accuracy-mean"] <= 1
    assert len(summary["client-accuracy-per-round"]) == 1
    assert "clients' accuracy with the model each is served" in stdout
    final = run.table("clients")
    assert sorted(final["group"].astype(str)) == ["0", "0", "1", "1"]
    evaluate = run.rounds("evaluate")
    assert all("served-ari" in r for r in evaluate)
    if strategy == "ifca":
        select = run.rounds("select")
        assert [sum(r["cluster-sizes"]) for r in select] == [4]
        assert set(final["model"]) <= {"cluster-0", "cluster-1"}
    else:
        train = run.rounds("train")
        assert train[0]["cfl-splits"] == ["shared"] and train[0]["coalitions"] == 2
        assert set(final["model"]) <= {"cfl-0", "cfl-1", "cfl-0.0", "cfl-0.1", "cfl-1.0", "cfl-1.1"}


def test_local_training_evaluates_every_client_with_its_own_model(run_app):
    folder, _ = run_app(f'{TYPED} strategy="local" clients-per-round=3', supernodes=3)
    run = RunFolder(folder)
    final = run.table("clients")
    assert final["model"].nunique() == 3 and all(m.startswith("own-") for m in final["model"])
    assert run.rounds("evaluate")[-1]["models-served"] == 3
    assert np.isfinite(final["mae-litres"]).all()
