"""A deployed node's own data file: its one household, whatever its partition id; no active filter."""

import numpy as np
import pandas as pd
import pytest

from bouquet.config import AppConfig
from bouquet.tasks.water import node_windows


def household_csv(path, household="home-1", days=60, litres_per_hour=5):
    stamps = pd.date_range("2016-03-01 00:30", periods=days * 24 + 1, freq="h")
    diffs = np.full(len(stamps), litres_per_hour)
    readings = np.cumsum(diffs)
    lines = ["user key;datetime;meter reading;diff"] + [
        f"{household};{t.strftime('%d/%m/%Y %H:%M:%S')};{r};{d}" for t, r, d in zip(stamps, readings, diffs)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_node_file_with_one_household_is_that_household(tmp_path):
    path = household_csv(tmp_path / "own.csv")
    config = AppConfig.from_run_config({"data-source": "daiad", "min-history-days": 30})  # active-factor stays 1.6
    household, windows, group = node_windows(config.water_data, 7, str(path))
    assert group == ""  # a real meter file: no known type
    assert household == "home-1"
    assert len(windows.y_train) + len(windows.y_test) == 60 - 12  # day 1 has 23 covered hours: kept, scaled
    np.testing.assert_allclose(windows.to_litres(windows.y_test), 120.0)


def test_short_node_file_is_a_clear_error(tmp_path):
    path = household_csv(tmp_path / "short.csv", days=10)
    config = AppConfig.from_run_config({"data-source": "daiad", "min-history-days": 5})
    with pytest.raises(ValueError, match="no household passes the filters"):
        node_windows(config.water_data, 0, str(path))


def test_a_worker_decodes_the_images_once_for_all_the_partitions_it_serves(monkeypatch):
    from types import SimpleNamespace

    from bouquet import client_app
    from bouquet.tasks import vision

    calls = []
    real = vision.load_images
    monkeypatch.setattr(vision, "load_images", lambda spec: calls.append(spec) or real(spec))
    vision.partitioned_images.cache_clear()
    vision.node_shard.cache_clear()
    config = AppConfig.from_run_config({"task": "vision", "vision-dataset": "digits", "shards-per-client": 1})
    shards = []
    for k in list(range(12)) * 2:  # more partitions than the per-shard cache holds, twice over
        context = SimpleNamespace(node_config={"partition-id": k, "num-partitions": 12})
        task = client_app.node_task(config, context)
        shards.append((task.partition_id, len(task.y), int(task.y.sum())))
    assert len(calls) == 1
    assert shards[:12] == shards[12:] and len({s[2] for s in shards[:12]}) > 1  # same shards, distinct ones


@pytest.mark.parametrize("node_config, missing", [
    ({"num-partitions": 12}, "'partition-id'"),
    ({"partition-id": 3}, "'num-partitions'"),
    ({}, "'partition-id', 'num-partitions'"),
])
def test_a_vision_node_without_its_partition_keys_names_them_all(node_config, missing):
    from types import SimpleNamespace

    from bouquet import client_app

    config = AppConfig.from_run_config({"task": "vision", "vision-dataset": "digits"})
    with pytest.raises(KeyError) as raised:
        client_app.node_task(config, SimpleNamespace(node_config=node_config))
    assert f"lacks {missing} (start the SuperNode with --node-config" in raised.value.args[0]


def test_the_identity_key_and_the_sketch_seed_are_the_partition_id():
    from types import SimpleNamespace

    from bouquet.node_identity import partition_id

    assert partition_id(SimpleNamespace(node_config={"partition-id": "7"})) == 7
    with pytest.raises(KeyError) as raised:
        partition_id(SimpleNamespace(node_config={"data-path": "own.csv"}))
    assert "lacks 'partition-id'" in raised.value.args[0]


@pytest.mark.parametrize("label_dtype", ["int64", "int32", "uint8"])
def test_the_sketch_loss_is_cross_entropy_for_any_integer_labels_and_mse_for_forecasts(label_dtype):
    import torch

    from bouquet.tasks.base import task_loss

    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    labels = torch.from_numpy(np.array([0, 1], dtype=label_dtype))
    expected = -(np.log(np.exp(2) / (np.exp(2) + 1)) + np.log(np.e / (np.e + 1))) / 2  # by hand
    assert task_loss(logits, labels).item() == pytest.approx(expected, rel=1e-6)
    assert task_loss(torch.tensor([1.0, 3.0]), torch.tensor([0.0, 1.0])).item() == pytest.approx(2.5)


def test_a_node_builds_its_task_once_and_reuses_it():
    """The ClientApp builds a node's task on its first message and reuses it for the next ones (a sketch query
    alone asks three times); another node, or another run config, gets its own."""
    from flwr.app import Context, RecordDict

    from bouquet import client_app

    config = AppConfig.from_run_config({})

    def context(partition):
        return Context(run_id=1, node_id=partition + 1, node_config={"partition-id": partition},
                       state=RecordDict(), run_config={})

    first = client_app.node_task(config, context(0))
    assert client_app.node_task(config, context(0)) is first
    other = client_app.node_task(config, context(1))
    assert other is not first and other.partition_id == 1 and first.partition_id == 0
    changed = AppConfig.from_run_config({"local-epochs": 2})
    assert client_app.node_task(changed, context(0)) is not first
    np.testing.assert_array_equal(client_app.node_task(changed, context(0)).windows.x_train, first.windows.x_train)
