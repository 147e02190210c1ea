"""End to end: the personalisation parts, the validation split and the server optimiser in real ``flwr run``s, and a
killed run with personal state resumed to the numbers of an uninterrupted one."""

import json
from pathlib import Path

import pandas as pd
import pytest

from bouquet.launch import local_superlink, resume_overrides
from bouquet.results import RunFolder
from tests.test_e2e_resume import FEDERATION, _comparable, _kill_after_checkpoint, _table

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[1]
SMALL = ('forecaster="improved" validation-fraction=0.2 num-server-rounds=2 clients-per-round=3 local-epochs=1 '
         "synthetic-households=150 active-factor=0.5")


@pytest.mark.parametrize("extra", [
    'strategy="fedavg" personalize-epochs=2 forecast-baseline="household" server-optimizer="adam"',
    pytest.param('strategy="hk-cosine" personal-layers="head" personalize-epochs=1',
                 marks=pytest.mark.tier2),  # second tier: FedPer is first-tier with IFCA below
    'strategy="fedmedian" ditto-lambda=0.5',
    'strategy="ifca" ifca-k=2 personal-layers="head" personalize-epochs=1',
], ids=["fine-tuning+household+fedadam", "hk+fedper", "fedmedian+ditto", "ifca+fedper"])
def test_personalisation_runs_end_to_end_with_validation_numbers(run_app, extra, tmp_path):
    folder, stdout = run_app(f"{SMALL} {extra} personal-state-dir=\"{tmp_path / 'nodes'}\"", supernodes=4)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["best-naive-chosen-on"] == "validation" and "blend" in summary["naive-mae-litres"]
    assert summary["val-mae-litres-mean"] > 0 and 0 <= summary["households-beating-own-best-naive"] <= 1
    clients = RunFolder(folder).table("clients")
    assert {"val-mae-litres", "naive-val-window-median"} <= set(clients.columns) and len(clients) == 4
    assert (folder / "report.png").stat().st_size > 10_000 and "report: " in stdout
    pool = RunFolder(folder).table("pool")
    assert pool.loc[pool["status"] == "pool", "validation_windows"].gt(0).all()
    if "server-optimizer" in extra:
        assert "Server optimizer: FedAdam" in stdout
        assert all(r["server-step-norm"] > 0 for r in RunFolder(folder).rounds("train"))
    if "personal-layers" in extra or "ditto" in extra:  # each node that trained kept its state on its own disk
        saved = sorted(p.parent.name for p in (tmp_path / "nodes").glob("*/*/a0-r*.npz"))
        trained = sorted({str(p) for p in RunFolder(folder).table("train_clients")["partition-id"]})
        assert sorted(set(saved)) == trained


@pytest.mark.tier2  # second tier: resume to the same numbers is first-tier (test_e2e_resume.py)
def test_a_killed_run_with_personal_state_resumes_to_the_same_numbers(tmp_path, superlink, ray_head):
    rounds, k = 4, 2
    common = (f'forecaster="improved" validation-fraction=0.2 strategy="fedavg" ditto-lambda=0.5 '
              f'personalize-epochs=1 num-server-rounds={rounds} clients-per-round=3 local-epochs=1 '
              f'synthetic-households=150 active-factor=0.5 seed=3 personal-state-dir="{tmp_path / "nodes"}" '
              f'results-dir="{tmp_path / "results"}"')
    done = superlink.flwr_run(ROOT, run_config=f'{common} run-name="whole"', federation_config=FEDERATION)
    whole = tmp_path / "results" / "whole"
    assert done.returncode == 0 and (whole / "summary.json").exists(), done.stdout[-3000:] + done.stderr[-3000:]
    crashed = tmp_path / "results" / "crashed"
    with local_superlink(tmp_path / "link-1", env={"RAY_ADDRESS": ray_head.address}) as link:
        _kill_after_checkpoint(link, crashed, k, f'{common} run-name="crashed"')
    assert not (crashed / "summary.json").exists()
    with local_superlink(tmp_path / "link-2", env={"RAY_ADDRESS": ray_head.address}) as link:
        done = link.flwr_run(ROOT, run_config=resume_overrides(crashed), federation_config=FEDERATION)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    a, b = json.loads((whole / "summary.json").read_text()), json.loads((crashed / "summary.json").read_text())
    assert b.pop("resumed-after-round") >= k
    assert _comparable(a) == _comparable(b)
    for table in ("clients", "train_clients"):
        pd.testing.assert_frame_equal(_table(crashed, table), _table(whole, table))
    assert (whole / "predictions.csv").read_bytes() == (crashed / "predictions.csv").read_bytes()
