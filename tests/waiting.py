"""Waiting in end-to-end tests for what a run in another thread writes."""

import time


def wait_for_checkpoint(folder, k, runner, timeout=600, detail=lambda: ""):
    """Wait until ``folder`` holds the checkpoint of round ``k``; fail if ``runner`` (a thread) ends first or
    ``timeout`` seconds pass (``detail()`` is added to the failure message)."""
    target = folder / "checkpoints" / f"round-{k:04d}.npz"
    deadline = time.monotonic() + timeout
    while not target.exists():
        assert time.monotonic() < deadline and runner.is_alive(), f"no checkpoint of round {k}{detail()}"
        time.sleep(0.05)
