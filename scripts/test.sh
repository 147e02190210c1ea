#!/usr/bin/env bash
# Install, then run the whole test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/ruff check --quiet .   # lint first: seconds, and a finding fails the run
# two workers (pytest-xdist): the deployment tests mostly wait on Flower's polls and heartbeats, so they
# overlap with the CPU-bound simulations
exec .venv/bin/python -m pytest -q -n 2 "$@"
