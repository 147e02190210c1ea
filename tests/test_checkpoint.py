"""Checkpoints and resume: the file (atomic, kept, fallback), the folder rewind, node ids across runs, config
checks, and a strategy resumed under new node ids that ends where an uninterrupted one does."""

import json
import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy import Result

from bouquet.algorithms.hk import HKParams
from bouquet.checkpoint import (
    CHECKPOINT_DIR,
    CheckpointError,
    CheckpointParams,
    check_resumable,
    join_arrays,
    keys_to_nodes,
    latest_checkpoint,
    list_checkpoints,
    missing_keys,
    nodes_to_keys,
    read_checkpoint,
    rewind_files,
    snapshot_files,
    split_arrays,
    write_checkpoint,
)
from bouquet.params import ParamError
from bouquet.results import RunRecorder
from bouquet.strategies import BouquetStrategy, Coalitions, HKRule, SamplingParams, UniformSampler
from bouquet.strategies.arrays import to_numpy, to_record
from bouquet.strategies.checkpoints import Checkpointing, restore
from bouquet.strategies.hooks import StopWhen
from bouquet.strategies.models import AssignedModels
from tests.flower_fakes import FakeGrid, make_message, reply_to

MODELS = {"shared": {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "steps": np.array([3], dtype=np.int64)},
          "group.c1": {"w": np.full((2, 3), 0.5, dtype=np.float64)}}

# ------------------------------------------------------------------ the file


def test_a_checkpoint_reads_back_exactly_and_only_the_newest_are_kept(tmp_path):
    for r in range(1, 5):
        write_checkpoint(tmp_path, r, {"config": {"seed": 1}, "note": f"round {r}"}, MODELS, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["round-0003.npz", "round-0004.npz"]
    assert not list((tmp_path / CHECKPOINT_DIR).glob("*.partial"))
    back = latest_checkpoint(tmp_path)
    assert back.server_round == 4 and back.meta["note"] == "round 4" and back.meta["config"] == {"seed": 1}
    assert list(back.models) == ["shared", "group.c1"] and list(back.models["shared"]) == ["w", "steps"]
    for key, model in MODELS.items():
        for name, value in model.items():
            assert back.models[key][name].dtype == value.dtype
            np.testing.assert_array_equal(back.models[key][name], value)


def test_a_truncated_or_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog):
    write_checkpoint(tmp_path, 1, {}, MODELS)
    newest = write_checkpoint(tmp_path, 2, {}, MODELS)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # the disk filled up mid-write
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(tmp_path).server_round == 1
    assert "round-0002.npz cannot be read" in caplog.text and "falling back" in caplog.text
    data = bytearray(newest.read_bytes())
    older = list_checkpoints(tmp_path)[0]
    raw = bytearray(older.read_bytes())
    raw[len(raw) // 3] ^= 0xFF  # one flipped byte inside a member: the zip CRC catches it
    older.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="no checkpoint of .* can be read"):
        latest_checkpoint(tmp_path)
    assert data  # (the truncated file was left in place for a post-mortem)


def test_no_checkpoint_is_a_clear_error_and_params_are_checked(tmp_path):
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        latest_checkpoint(tmp_path)
    (tmp_path / CHECKPOINT_DIR).mkdir()
    (tmp_path / CHECKPOINT_DIR / "round-0001.npz").write_text("not a zip")
    with pytest.raises(CheckpointError, match="cannot be read"):
        read_checkpoint(tmp_path / CHECKPOINT_DIR / "round-0001.npz")
    with pytest.raises(ParamError, match="checkpoint-keep"):
        CheckpointParams(keep=0)
    with pytest.raises(ParamError, match="checkpoint-every"):
        CheckpointParams(every=-1)
    assert [r for r in range(1, 8) if CheckpointParams(every=3).due(r, 7)] == [3, 6, 7]
    assert not any(CheckpointParams(every=0).due(r, 7) for r in range(1, 8))


def test_rewind_cuts_the_folder_back_to_the_checkpoint(tmp_path):
    recorder = RunRecorder(tmp_path)
    recorder.log_round(1, "train", {"loss": 1.0})
    recorder.append_rows("clients", [{"node": 1, "mae": 2.0}])
    sizes = snapshot_files(tmp_path)
    write_checkpoint(tmp_path, 1, {}, MODELS)
    assert set(sizes) == {"rounds.jsonl", "clients.csv"}  # checkpoints are not part of it
    recorder.log_round(2, "train", {"loss": 0.5})
    recorder.append_rows("clients", [{"node": 1, "mae": 1.0}])
    (tmp_path / "trajectories").mkdir()
    (tmp_path / "trajectories" / "round-002.npz").write_bytes(b"x")
    changed = rewind_files(tmp_path, sizes)
    assert snapshot_files(tmp_path) == sizes and len(changed) == 3
    resumed = RunRecorder.reopen(tmp_path)
    resumed.append_rows("clients", [{"mae": 1.5, "node": 1}])  # the header's column order, not the row's
    assert (tmp_path / "clients.csv").read_text().splitlines() == ["node,mae", "1,2.0", "1,1.5"]
    (tmp_path / "rounds.jsonl").write_text("")
    with pytest.raises(CheckpointError, match="shorter than when the checkpoint was written"):
        rewind_files(tmp_path, sizes)
    with pytest.raises(FileNotFoundError, match="no run folder"):
        RunRecorder.reopen(tmp_path / "absent")


# ------------------------------------------------------------------ node ids across runs


def test_node_ids_become_stable_keys_and_come_back_as_the_new_runs_ids():
    old = {8_123_456_789_012: 0, 7_000_000_000_001: 1}
    state = {"assignment": {"8123456789012": "c1", "7000000000001": "c2"}, "history": [[8_123_456_789_012, 3]],
             "last-round": {"7000000000001": 2}, "count": 2, "name": "8123456789012x"}
    named = nodes_to_keys(state, old)
    assert json.loads(json.dumps(named)) == named
    assert named["assignment"] == {"@node-text:0": "c1", "@node-text:1": "c2"} and named["history"] == [["@node:0", 3]]
    new = {55: 0, 66: 1}
    back = keys_to_nodes(named, new)
    assert back == {"assignment": {"55": "c1", "66": "c2"}, "history": [[55, 3]], "last-round": {"66": 2},
                    "count": 2, "name": "8123456789012x"}
    assert missing_keys(named, {55: 0}) == {"@node-text:1"}
    with pytest.raises(CheckpointError, match="no stable identity"):
        nodes_to_keys(state, {8_123_456_789_012: None})


def test_long_float_lists_travel_as_arrays_bit_for_bit():
    rng = np.random.default_rng(0)
    sketch = rng.normal(size=40).tolist()
    state = {"known": {"@node-text:1": {"values": sketch, "loss": 0.5}}, "short": [0.1, 0.2], "ids": list(range(50))}
    plain, arrays = split_arrays(state)
    assert plain["known"]["@node-text:1"]["values"] == {"@array": "s0"} and plain["short"] == [0.1, 0.2]
    assert plain["ids"] == list(range(50)) and list(arrays) == ["s0"]  # integers stay JSON
    back = join_arrays(json.loads(json.dumps(plain)), arrays)
    assert back == state and all(a == b for a, b in zip(back["known"]["@node-text:1"]["values"], sketch))
    with pytest.raises(CheckpointError, match="lacks the state array"):
        join_arrays(plain, {})


def test_resume_refuses_another_config_or_version_and_names_what_differs(tmp_path):
    write_checkpoint(tmp_path, 3, {"config": {"seed": 0, "hk-tau": 0.75, "num-server-rounds": 5, "run-name": "a"},
                                   "version": "0.1.0"}, MODELS)
    checkpoint = latest_checkpoint(tmp_path)
    same = {"seed": 0, "hk-tau": 0.75, "num-server-rounds": 5, "run-name": "b", "resume-from": str(tmp_path)}
    check_resumable(checkpoint, same, "0.1.0")
    with pytest.raises(CheckpointError, match=r"hk-tau: 0.75 then, 0.9 now"):
        check_resumable(checkpoint, {**same, "hk-tau": 0.9}, "0.1.0")
    with pytest.raises(CheckpointError, match="bouquet 0.1.0, this is bouquet 0.2.0"):
        check_resumable(checkpoint, same, "0.2.0")
    with pytest.raises(CheckpointError, match="resume-allow-rounds"):
        check_resumable(checkpoint, {**same, "num-server-rounds": 8}, "0.1.0")
    check_resumable(checkpoint, {**same, "num-server-rounds": 8}, "0.1.0", allow_new_rounds=True)
    with pytest.raises(CheckpointError, match="after round 3"):
        check_resumable(checkpoint, {**same, "num-server-rounds": 2}, "0.1.0", allow_new_rounds=True)


# ------------------------------------------------------------------ a strategy resumed under new node ids

TARGETS = [[4.0, 0.0], [0.0, 4.0], [4.2, 0.0], [0.0, 4.2], [3.8, 0.0], [0.0, 3.8]]


def _grid(base):
    """Nodes ``base + k`` (partition k) whose training moves the model halfway to target k."""
    keys = {base + k: k for k in range(len(TARGETS))}

    def handler(msg):
        part = keys[msg.metadata.dst_node_id]
        w = msg.content["arrays"]["w"].numpy()
        target = np.asarray(TARGETS[part], dtype=np.float32)
        if msg.metadata.message_type == "train":
            trained = (w + 0.5 * (target - w)).astype(np.float32)
            return reply_to(msg, RecordDict({"arrays": ArrayRecord({"w": Array(trained)}),
                                             "metrics": MetricRecord({"num-examples": 10 + part})}))
        return reply_to(msg, RecordDict({"metrics": MetricRecord({"num-examples": 1,
                                                                  "error": float(np.sum((w - target) ** 2))})}))

    return FakeGrid(sorted(keys), keys=keys, handler=handler)


def _strategy(wait=30.0, hooks=None):
    return BouquetStrategy(sampler=UniformSampler(SamplingParams(clients_per_round=4, seed=3, node_wait_seconds=wait,
                                                                 identify_nodes=True)),
                           aggregator=Coalitions(HKRule(HKParams(tau=0.9))), models=AssignedModels(),
                           hooks=hooks, message_factory=make_message)


def _served(strategy, grid):
    keys = grid.keys
    return {keys[node]: (key, to_numpy(arrays)["w"].tolist()) for node, (key, arrays) in strategy.serve(grid).items()}


def test_a_resumed_strategy_with_new_node_ids_ends_where_the_uninterrupted_one_does(tmp_path):
    initial = to_record({"w": np.array([0.1, 0.1], dtype=np.float32)})
    whole, grid = _strategy(), _grid(100)
    final = whole.start(grid, initial, num_rounds=5)
    expected = _served(whole, grid)

    first = _strategy(hooks=[Checkpointing(tmp_path, {}, CheckpointParams(every=3), num_rounds=5),
                             StopWhen(lambda r, _: r == 3)])
    first.start(_grid(100), initial, num_rounds=5)
    saved = list_checkpoints(tmp_path)
    assert [p.name for p in saved] == ["round-0003.npz"] and first.server_round == 3
    checkpoint = read_checkpoint(saved[0])
    assert "100" not in json.dumps(checkpoint.meta["state"])  # no node id of the old run

    resumed, new_grid = _strategy(), _grid(900)  # a new simulation: new node ids
    result = restore(resumed, new_grid, checkpoint)
    assert isinstance(result, Result) and sorted(result.train_metrics_clientapp) == [1, 2, 3]
    again = resumed.start(new_grid, initial, num_rounds=5, result=result)
    np.testing.assert_array_equal(again.arrays["w"].numpy(), final.arrays["w"].numpy())
    assert sorted(again.evaluate_metrics_clientapp) == [1, 2, 3, 4, 5]
    for r in range(1, 6):
        assert dict(again.evaluate_metrics_clientapp[r]) == pytest.approx(dict(final.evaluate_metrics_clientapp[r]))
    assert _served(resumed, new_grid) == expected  # every partition served the same model, by the same key

    with pytest.raises(CheckpointError, match="not connected"):
        restore(_strategy(wait=0.5), FakeGrid([901, 902], keys={901: 0, 902: 1}), checkpoint)


def test_the_server_reopens_only_an_unfinished_run_with_a_matching_checkpoint(tmp_path):
    from bouquet import __version__
    from bouquet.config import AppConfig
    from bouquet.server_app import _reopen

    folder = tmp_path / "run"
    original = AppConfig.from_run_config({"run-name": "run", "results-dir": str(tmp_path)})
    recorder = RunRecorder(folder)
    recorder.log_round(1, "train", {"loss": 1.0})
    write_checkpoint(folder, 1, {"config": original.to_run_config(), "version": __version__,
                                 "files": snapshot_files(folder)}, MODELS)
    recorder.log_round(2, "train", {"loss": 0.5})  # written after the checkpoint: cut on resume
    resume = AppConfig.from_run_config({"resume-from": str(folder)})
    reopened, checkpoint = _reopen(resume)
    assert reopened.folder == folder.resolve() and checkpoint.server_round == 1
    assert [r["round"] for r in reopened.rounds()] == [1]
    with pytest.raises(CheckpointError, match="hk-tau"):
        _reopen(AppConfig.from_run_config({"resume-from": str(folder), "hk-tau": 0.5}))
    with pytest.raises(CheckpointError, match="no run folder"):
        _reopen(AppConfig.from_run_config({"resume-from": str(tmp_path / "absent")}))
    (folder / "summary.json").write_text("{}")
    with pytest.raises(CheckpointError, match="finished run"):
        _reopen(resume)


def test_a_node_without_a_stable_key_does_not_stop_the_checkpoint(tmp_path, caplog):
    strategy, grid = _strategy(hooks=[Checkpointing(tmp_path, {}, CheckpointParams(), num_rounds=2)]), _grid(100)
    grid.keys.pop(105)  # node 105 answers no identity query (a ClientApp without the handler, or too slow)
    with caplog.at_level(logging.WARNING):
        strategy.start(grid, to_record({"w": np.array([0.1, 0.1], dtype=np.float32)}), num_rounds=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["round-0001.npz", "round-0002.npz"]
    assert "1 node(s) reported no stable identity" in caplog.text
    assert read_checkpoint(list_checkpoints(tmp_path)[-1]).meta["state"]["nodes"]["keys"]["105"] is None


def test_the_experiment_runner_resumes_an_interrupted_run_only_when_its_checkpoint_fits(tmp_path):
    from bouquet import __version__
    from bouquet.config import AppConfig
    from bouquet.experiments import resume_point

    folder = tmp_path / "seed-0"
    runner_config = {"seed": 0, "hk-tau": 0.75, "num-server-rounds": 5, "results-dir": str(tmp_path),
                     "run-name": "seed-0"}
    after, why = resume_point(folder, runner_config)
    assert after is None and "no run folder" in why
    folder.mkdir()
    after, why = resume_point(folder, runner_config)
    assert after is None and "no checkpoint" in why  # the runner then starts the run again
    write_checkpoint(folder, 2, {"config": AppConfig.from_run_config(runner_config).to_run_config(),
                                 "version": __version__, "files": {}}, MODELS)
    write_checkpoint(folder, 3, {"config": AppConfig.from_run_config(runner_config).to_run_config(),
                                 "version": __version__, "files": {}}, MODELS)
    assert resume_point(folder, runner_config) == (3, "")
    assert resume_point(folder, {**runner_config, "max-in-flight": 50, "round-timeout": 60.0}) == (3, "")
    after, why = resume_point(folder, {**runner_config, "hk-tau": 0.5})  # the arm's file was edited meanwhile
    assert after is None and "hk-tau" in why
    after, why = resume_point(folder, {**runner_config, "hk-taau": 0.5})
    assert after is None and "unknown run-config key 'hk-taau'" in why


def test_a_run_recorded_under_an_old_key_name_resumes_under_the_new_one(tmp_path):
    from bouquet.config import DEPRECATED_KEYS, AppConfig

    config = AppConfig.from_run_config({"coalition-min-fraction": 0.25}).to_run_config()
    recorded = {("hk-min-coalition-fraction" if k == "coalition-min-fraction" else k): v for k, v in config.items()}
    write_checkpoint(tmp_path, 1, {"config": recorded, "version": "1"}, MODELS)
    checkpoint = latest_checkpoint(tmp_path)
    check_resumable(checkpoint, config, "1", renamed=DEPRECATED_KEYS)
    with pytest.raises(CheckpointError, match="coalition-min-fraction: '<absent>' then, 0.25 now"):
        check_resumable(checkpoint, config, "1")


def test_numpy_arrays_in_a_state_keep_their_dtype_and_shape_through_the_split():
    moments = {"m": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "n": 3, "sketch": [0.5] * 40}
    plain, arrays = split_arrays(moments)
    assert plain["m"]["w"] == {"@ndarray": "s0"} and plain["sketch"] == {"@array": "s1"}
    back = join_arrays(plain, arrays)
    assert back["m"]["w"].dtype == np.float32 and back["m"]["w"].shape == (2, 3)
    np.testing.assert_array_equal(back["m"]["w"], moments["m"]["w"])
    assert back["sketch"] == [0.5] * 40 and back["n"] == 3


def test_no_run_writes_over_another_runs_folder(tmp_path):
    first = RunRecorder.create(tmp_path, "", label="x")
    first.log_round(1, "train", {"loss": 1.0})
    second = RunRecorder.create(tmp_path, "", label="x")  # the same second: a folder of its own
    assert second.folder != first.folder
    with pytest.raises(FileExistsError, match="holds another \\(interrupted\\) run: resume it with resume-from"):
        RunRecorder.create(tmp_path, first.folder.name)
    first.write_json("summary.json", {"done": True})
    with pytest.raises(FileExistsError, match="already holds a finished run"):
        RunRecorder(first.folder)
    assert RunRecorder.reopen(second.folder).resumed


def test_waiting_for_a_checkpoint_ends_when_it_is_written_or_the_run_ends(tmp_path):
    """What the end-to-end tests and the deployment soak wait on before they act at a round boundary."""
    import threading
    import time

    from bouquet.checkpoint import checkpoint_path, wait_for_checkpoint

    def write_later():
        time.sleep(0.2)
        checkpoint_path(tmp_path, 2).parent.mkdir(parents=True, exist_ok=True)
        checkpoint_path(tmp_path, 2).write_bytes(b"")

    runner = threading.Thread(target=write_later)
    runner.start()
    assert wait_for_checkpoint(tmp_path, 2, runner.is_alive, timeout=30)
    runner.join()
    assert not wait_for_checkpoint(tmp_path, 3, runner.is_alive, timeout=30)  # the run ended without it
    assert not wait_for_checkpoint(tmp_path, 3, lambda: True, timeout=0.2)  # timed out
    assert checkpoint_path(tmp_path, 7) == tmp_path / "checkpoints" / "round-0007.npz"
