#!/usr/bin/env bash
# Install, then run the default job: the water-use LSTM on the synthetic Alicante-like data
# (179 households pass the paper's filters), 50 rounds of 50 sampled clients, in Flower's
# simulation on a private local SuperLink that is stopped afterwards. Extra arguments go to
# `python -m bouquet.launch` (e.g. --run-config 'num-server-rounds=5').
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/python -m bouquet.launch . "$@"
