#!/usr/bin/env bash
# Create .venv (if missing) and install bouquet with its test extras and the forecasting baselines' extra (the
# studies' statsforecast / mlforecast / LightGBM, and the oracle of the nodes' naive forecasters in the tests).
# Torch: a CPU build is enough. Set TORCH_SPEC / PIP_EXTRA_INDEX_URL to choose another
# (e.g. PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu for CPU-only wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet "$TORCH_SPEC" 2>&1 | grep -v "^WARNING: Location" || true
fi
.venv/bin/python -m pip install --quiet -e ".[app,test,forecasting]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import bouquet, flwr, torch; print('bouquet', bouquet.__version__, '| flwr', flwr.__version__, '| torch', torch.__version__)"
