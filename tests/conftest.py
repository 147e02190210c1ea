"""Shared fixtures: an isolated data cache, and the path of the shared real data."""

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
DAIAD_ZIP = SHARED_DATA / "daiad" / "swm_trialA.zip"


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("BOUQUET_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture
def server_identity(monkeypatch):
    """Set what a ServerApp process sets, so that strategies can build Flower messages in-process."""
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)


@pytest.fixture
def daiad_zip() -> Path:
    if not DAIAD_ZIP.exists():
        pytest.skip(f"real DAIAD file not found at {DAIAD_ZIP} (shared data is only on developer/CI machines)")
    return DAIAD_ZIP
