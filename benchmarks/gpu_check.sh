#!/usr/bin/env bash
# The GPU path, end to end on one device (benchmarks/gpu_check.py says what runs); last line JSON.
#
# On a machine with an NVIDIA GPU (offline; at most 8 minutes on an H100 is the target):
#   bash benchmarks/gpu_check.sh                      # a Qwen2.5-0.5B-shaped policy, random weights
#   bash benchmarks/gpu_check.sh --model DIR_OR_HUB   # a real model instead
#   bash benchmarks/gpu_check.sh --device cpu --shape tiny --new-tokens 8 --batch 8   # the suite's run
# env: PYTHON (default python). Record what it prints in docs/scaling.md ("Verified where"); what a
# GPU session runs beside it (masked_decode.py's rollout-shaped case, the bf16 compiled-agreement
# test) is listed there under "What only a GPU shows". Run it from the repository root: it runs
# `python -m benchmarks.gpu_check`, which imports the package `benchmarks` from there.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
if [[ "$(pwd -P)" != "$ROOT" ]]; then
  echo "gpu_check.sh: run it from the repository root, $ROOT (it runs python -m benchmarks.gpu_check)" >&2
  exit 2
fi
exec "${PYTHON:-python}" -m benchmarks.gpu_check "$@"
