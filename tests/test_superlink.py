"""bouquet's SuperLink entry: Flower's SuperLink whose SQLite state waits out a locked database."""

import threading
import time

import pytest

from bouquet.processes import hold_write_lock
from bouquet.superlink import DEFAULT_BUSY_TIMEOUT_S, _parse, patient_sqlite, superlink_command


@pytest.fixture
def flower_store(tmp_path):
    """Flower's own SQLite state class (its object store), on a file, as a SuperLink with --database has it."""
    from flwr.supercore.object_store.sql_object_store import SqlObjectStore

    store = SqlObjectStore(str(tmp_path / "state.db"))
    store.initialize()
    return store, tmp_path / "state.db"


def _busy_timeout(store):
    from sqlalchemy import text

    with store._engine.connect() as connection:  # the test reads the pragma on Flower's engine
        return connection.execute(text("PRAGMA busy_timeout")).scalar()


def _write_through_a_lock(store, database, seconds):
    """Hold the database's write lock ``seconds`` while Flower's store writes; the error or None, and the wait."""
    held = threading.Event()
    holder = threading.Thread(target=hold_write_lock, args=(database, seconds, held))
    holder.start()
    held.wait(30)
    started = time.monotonic()
    try:
        store.clear()  # a write: it needs the lock
        error = None
    except Exception as caught:  # noqa: BLE001 -- the test reports what Flower raised
        error = caught
    waited = time.monotonic() - started
    holder.join()
    return error, waited


def test_flowers_state_waits_5_s_for_a_lock_and_ours_the_timeout_we_set(flower_store):
    store, _ = flower_store
    assert _busy_timeout(store) == 5000  # Flower 1.42's pragma: a release that changes it shows up here
    remove = patient_sqlite(42.5)
    try:
        assert _busy_timeout(store) == 42500
    finally:
        remove()


def test_a_write_through_a_lock_longer_than_5_s_fails_in_flower_and_waits_with_ours(flower_store):
    store, database = flower_store
    error, waited = _write_through_a_lock(store, database, 6.5)
    assert error is not None and "database is locked" in str(error) and waited < 6.4
    remove = patient_sqlite(30)
    try:
        error, waited = _write_through_a_lock(store, database, 6.5)
    finally:
        remove()
    assert error is None and waited >= 6.0


def test_the_entry_passes_every_other_option_to_flower_and_names_a_bad_timeout(capsys):
    assert _parse(["--insecure", "--database", "s.db"]) == (DEFAULT_BUSY_TIMEOUT_S, ["--insecure", "--database", "s.db"])
    assert _parse(["--state-busy-timeout", "7.5", "--insecure"]) == (7.5, ["--insecure"])
    for bad in ("0", "-3", "nan", "inf", "soon"):
        with pytest.raises(SystemExit):
            _parse(["--state-busy-timeout", bad])
        assert "state-busy-timeout" in capsys.readouterr().err
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="state-busy-timeout"):
            patient_sqlite(bad)
    command = superlink_command(["--insecure"], 60)
    assert command[1:] == ["-m", "bouquet.superlink", "--state-busy-timeout", "60", "--insecure"]


@pytest.mark.e2e
@pytest.mark.tier2  # second tier: ~2 min, a run that outlives Flower's 60 s heartbeat deadline
def test_a_deployment_whose_state_database_is_locked_25_s_finishes_its_run(tmp_path):
    """A real SuperLink with its state database and three SuperNodes: the database's write lock is held 25 s
    (longer than a heartbeat period) after the first round.  Flower's own SuperLink fails such a run ("No
    heartbeat received from the task", docs/RELIABILITY.md); bouquet's finishes it, with every round."""
    import json
    from pathlib import Path

    from bouquet.deploy import deployment, start_supernode, wait_for_nodes
    from tests.waiting import wait_for_checkpoint

    root = Path(__file__).resolve().parents[1]
    folder = tmp_path / "results" / "locked"
    config = ('num-server-rounds=12 clients-per-round=3 fraction-evaluate=0 synthetic-households=100 '
              f'active-factor=0.5 local-epochs=1 seed=5 results-dir="{tmp_path / "results"}" run-name="locked"')
    with deployment(tmp_path, secure=False) as deploy:
        for partition in range(3):
            start_supernode(deploy, partition)
        assert wait_for_nodes(deploy, 3) == 3
        outcome = {}
        runner = threading.Thread(target=lambda: outcome.update(done=deploy.run(root, run_config=config)))
        runner.start()
        wait_for_checkpoint(folder, 1, runner)
        hold_write_lock(tmp_path / "state.db", 25)
        runner.join(timeout=900)
        runs = deploy.wait_for_runs(600)  # the lock may cut `flwr run --stream`'s log stream before the run ends
    assert [(r["status"], r["status-details"]) for r in runs] == [("finished:completed", "N/A")]
    assert (folder / "summary.json").exists()
    trained = [json.loads(line)["round"] for line in (folder / "rounds.jsonl").read_text().splitlines()
               if json.loads(line)["phase"] == "train"]
    assert trained == list(range(1, 13))
