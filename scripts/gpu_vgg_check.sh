#!/usr/bin/env bash
# On a GPU machine: does the SCKM paper's VGG-16 train at the full profile's settings?
#
# In-process FedAvg with seeded random selection (scripts/sckm_regime_probe.py --device cuda; the app's own
# shards, training and scoring functions, no Flower, so it runs where only torch is): vgg16 and vgg16-bn,
# B = 2 of 10 CIFAR-10 clients, S = 1, 2, 5 shards per client, 60 rounds (Table 5's), 10 local SGD steps of
# 32 at lr 0.01 with momentum 0.9 (experiments/sckm/profiles/full.toml), the whole test set every 5 rounds,
# seeds 0 1 2.  First the CUDA-against-CPU test of tests/test_vision.py.  The paper's Table 5 has random
# selection at 41-50 %.
#
#   cp ../shared/data/cifar10/cifar10-jpeg.tar.gz .gpu-data/   # .gpu-data/ is ignored by git
#   bash scripts/gpu_vgg_check.sh                              # on the device: carry .gpu-data, OUT=$OUT
#
# Needs python3 with torch (CUDA), numpy, pandas, matplotlib, pillow and pytest.  Environment: OUT (default
# results/gpu-vgg: curves.csv, table.md, curves.png, probe.log, pytest.log), CIFAR, DEVICE (default cuda;
# cpu for a dry run), ROUNDS, SEEDS, SHARDS, MODELS.  A GPU seen here in a 2-minute budget:
# see docs/RESULTS.md (not yet run: no GPU has been lent to this project).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-results/gpu-vgg}"
CIFAR="${CIFAR:-.gpu-data/cifar10-jpeg.tar.gz}"
DEVICE="${DEVICE:-cuda}"
ROUNDS="${ROUNDS:-60}"
SEEDS="${SEEDS:-0 1 2}"
SHARDS="${SHARDS:-1 2 5}"
MODELS="${MODELS:-vgg16 vgg16-bn}"
PYTHON="${PYTHON:-python3}"
CURVES="$(mktemp -d)"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
[ -f "$CIFAR" ] || { echo "no CIFAR-10 tarball at $CIFAR" >&2; exit 2; }
"$PYTHON" -c "
import torch
print('torch', torch.__version__, '| CUDA:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none')
assert '$DEVICE' == 'cpu' or torch.cuda.is_available(), 'DEVICE=$DEVICE but torch sees no CUDA device'
" | tee "$OUT/probe.log"
"$PYTHON" -m pytest -q --noconftest -p no:cacheprovider tests/test_vision.py -k "cuda or device" 2>&1 | tee "$OUT/pytest.log"
for model in $MODELS; do
  # shellcheck disable=SC2086  # SHARDS and SEEDS are lists
  "$PYTHON" scripts/sckm_regime_probe.py --device "$DEVICE" --data "$CIFAR" --model "$model" --shards $SHARDS \
      --rounds "$ROUNDS" --eval-every 5 --eval-size 10000 --learning-rate 0.01 --momentum 0.9 --seeds $SEEDS \
      --threads 4 --out "$CURVES" 2>&1 | tee -a "$OUT/probe.log"
done
"$PYTHON" scripts/sckm_regime_probe.py --out "$CURVES" --summarise "$OUT"
cat "$OUT/table.md"
rm -rf "$CURVES"
