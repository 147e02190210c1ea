"""The studies behind the docs: runners and probes that start many runs of the app and write a results folder.

Each module is what ``scripts/<name>.py`` runs (``python scripts/run_hk_experiments.py --help``); the scripts
only call its ``main``.  The studies read the experiment layers under ``experiments/`` and start the app from
the source checkout, so they run from a checkout (``pip install -e .``), not from an installed wheel.
"""

from pathlib import Path

__all__ = ["ROOT"]

#: The source checkout the studies run from: the app (``pyproject.toml``), ``experiments/`` and ``scripts/``.
ROOT = Path(__file__).resolve().parents[2]
