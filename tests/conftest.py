"""Shared fixtures: an isolated data cache, and the path of the shared real data."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
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


@pytest.fixture
def run_app(tmp_path):
    """``run_app(run_config, supernodes=4)``: one real ``flwr run`` of this app; returns (run folder, stdout)."""
    from bouquet.launch import local_superlink

    def run(run_config: str, supernodes: int = 4):
        results = tmp_path / "results"
        with local_superlink(tmp_path / "link") as link:
            done = link.flwr_run(ROOT, run_config=f'{run_config} results-dir="{results}" run-name="e2e"',
                                 federation_config=f"num-supernodes={supernodes} client-resources-num-cpus=1")
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        return results / "e2e", done.stdout

    return run
