#!/usr/bin/env bash
# GPU smoke test: a few steps of ZeroSearch-style RL with a small real model; prints step time and
# tokens/s per step, then a JSON summary as the last line.
#
# Run (on a machine with an NVIDIA GPU, online once to fetch the model):
#   bash benchmarks/gpu_smoke.sh [MODEL] [STEPS]
#   MODEL  default Qwen/Qwen2.5-0.5B-Instruct (a hub name or a local directory)
#   STEPS  default 3 (the first step includes warm-up; the summary averages the others)
#   env:   PYTHON (default python), RUN_DIR (default runs/gpu_smoke, wiped), POLICY_KIND (default hf)
#
# What runs: `simsearch train` on one GPU with a recipe written below. Questions are the tiny
# world's (simsearch.data.tinyworld, fictional facts: the reward says nothing here, speed does);
# the search engine is a prompt-based simulator (ZeroSearch's prompt-only mode) played by the
# same small model in-process; REINFORCE, 16 questions x 5 rollouts, 2 search turns, 256 new tokens
# per turn, bf16, gradient checkpointing.
#
# The policy generates with the in-process transformers engine by default (policy.kind=hf); run
# with POLICY_KIND=vllm to time vLLM rollouts with weight sync after every update (vLLM must be
# installed). Nothing in this script has been run on a GPU yet: it is the check that GPU runs
# still have to pass (docs/scaling.md).
set -euo pipefail

MODEL=${1:-Qwen/Qwen2.5-0.5B-Instruct}
STEPS=${2:-3}
PY=${PYTHON:-python}
RUN=${RUN_DIR:-runs/gpu_smoke}
POLICY_KIND=${POLICY_KIND:-hf}
# vLLM's log-probabilities differ slightly from the trainer's: correct with truncated IS there.
TIS_CAP=0.0
if [ "$POLICY_KIND" = vllm ]; then TIS_CAP=2.0; fi

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_smoke: no NVIDIA GPU found (nvidia-smi is missing or fails); this benchmark needs one. Nothing was run." >&2
    exit 2
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_smoke: nvidia-smi sees a GPU but torch.cuda.is_available() is False in $PY (a CPU-only torch build?); install a CUDA build of torch. Nothing was run." >&2
    exit 2
fi

rm -rf "$RUN"
mkdir -p "$RUN"
"$PY" -c 'import sys; from simsearch.data.tinyworld import build_world; build_world(seed=0).write(sys.argv[1])' "$RUN/data"

cat > "$RUN/smoke.yaml" <<EOF
# simsearch train $RUN/smoke.yaml   (written by benchmarks/gpu_smoke.sh)
seed: 0
run_dir: $RUN/run
policy:
  kind: $POLICY_KIND
  batch_size: 80
  gpu_memory_utilization: 0.3
  model: {path: $MODEL, dtype: bfloat16, device: cuda}
sampling: {temperature: 1.0, top_p: 1.0, max_new_tokens: 256}
data:
  train: [$RUN/data/train.jsonl]
search:
  kind: simulator
  top_k: 3
  simulator:
    preset: zerosearch-prompt
    chat: true
    temperature: 0.8
    max_new_tokens: 256
    generation:
      kind: hf
      batch_size: 64
      model: {path: $MODEL, dtype: bfloat16, device: cuda}
curriculum: {kind: exponential, p_start: 0.0, p_end: 0.5, base: 4.0}
rollout: {template: search-r1-chat, max_turns: 2, group_size: 5, max_context_tokens: 2048, max_obs_tokens: 512}
reward: {weights: {f1: 1.0}}
algorithm: {estimator: reinforce, kl_coef: 0.001, kl_estimator: k3, tis_cap: $TIS_CAP}
optim: {lr: 1.0e-6}
steps: $STEPS
prompts_per_step: 16
micro_batch_size: 8
gradient_checkpointing: true
bf16: true
save_every: 0
eval_every: 0
resume: false
tensorboard: false
EOF

GPU=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)
echo "gpu_smoke: $MODEL, $STEPS steps on $GPU (policy.kind=$POLICY_KIND)"
"$PY" -m simsearch.cli train "$RUN/smoke.yaml"

"$PY" - "$RUN/run" "$MODEL" "$GPU" "$POLICY_KIND" <<'EOF'
import json, statistics, sys
from simsearch.runlog import read_metrics

run, model, gpu, kind = sys.argv[1:]
rows = read_metrics(run)
print(f"{'step':>4} {'step_s':>8} {'rollout_s':>9} {'update_s':>8} {'tokens/s':>9}")
for row in rows:
    print(f"{row['step']:>4} {row['time/step_s']:>8.2f} {row['time/rollout_s']:>9.2f} "
          f"{row['time/update_s']:>8.2f} {row['perf/tokens_per_s']:>9.0f}")
timed = rows[1:] or rows  # step 1 includes CUDA / allocator warm-up
print(json.dumps({
    "model": model, "gpu": gpu, "policy_kind": kind, "steps": len(rows),
    "step_s": statistics.mean(r["time/step_s"] for r in timed),
    "tokens_per_s": statistics.mean(r["perf/tokens_per_s"] for r in timed),
    "rollout_s": statistics.mean(r["time/rollout_s"] for r in timed),
    "update_s": statistics.mean(r["time/update_s"] for r in timed),
}))
EOF
