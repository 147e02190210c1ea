#!/usr/bin/env bash
# Install, then run the test suite (extra arguments go to pytest).
#   bash scripts/test.sh           the first tier: every capability, end to end with real Flower processes (~10 min on 2 cores)
#   bash scripts/test.sh --tier2   the second tier: slow tests whose capability the first tier also covers (deployment
#                                  faults, study smoke runs, more resume variants; ~15 min)
#   bash scripts/test.sh --all     both tiers in one run
set -euo pipefail
cd "$(dirname "$0")/.."
tier=(-m "not tier2")
case "${1:-}" in
  --tier2) tier=(-m tier2); shift ;;
  --all) tier=(); shift ;;
esac
bash scripts/install.sh
.venv/bin/ruff check --quiet .   # lint first: seconds, and a finding fails the run
# two workers (pytest-xdist): the deployment tests mostly wait on Flower's polls and heartbeats, so they
# overlap with the CPU-bound simulations
exec .venv/bin/python -m pytest -q -n 2 ${tier[@]+"${tier[@]}"} "$@"
