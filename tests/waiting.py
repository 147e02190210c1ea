"""Waiting in end-to-end tests for what a run in another thread writes."""

from bouquet.checkpoint import wait_for_checkpoint as _wait


def wait_for_checkpoint(folder, k, runner, timeout=600, detail=lambda: ""):
    """Wait until ``folder`` holds the checkpoint of round ``k``; fail if ``runner`` (a thread) ends first or
    ``timeout`` seconds pass (``detail()`` is added to the failure message)."""
    assert _wait(folder, k, runner.is_alive, timeout), f"no checkpoint of round {k}{detail()}"
