#!/usr/bin/env bash
# Every GPU figure and test in one call (docs/speed.md, "On a GPU" and "GPU decode"), for a lent machine with a
# time budget: each part has its own limit, and what a part printed is kept under $OUT (default ./gpu-out) even
# when a later part is stopped. Carry .whl (benchmarks/gpu_wheels.sh) to a bare image.
#     bash benchmarks/gpu_session.sh            # ≈ 8 minutes on one H100/H200
#     bash benchmarks/gpu_session.sh suite      # instead: every non-slow test with CUDA present (≈ 4 minutes)
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:.
fi
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; } \
  > "$OUT/machine.txt" 2>&1
start=$(date +%s); mark() { echo "[gpu_session] $1 at $(( $(date +%s) - start )) s"; }
# "suite": every non-slow test with CUDA present, and nothing else (a call of its own: with the figures it would
# pass a 10-minute call limit); -v prints each result as it comes, so the names of the failures survive the time
# limit (suite_failures.txt), and -rf prints their reasons at the end.
if [ "${1:-}" = suite ]; then
  mark "suite with CUDA present"
  workers=""; python3 -c "import xdist" 2>/dev/null && workers="-n ${GPU_SUITE_WORKERS:-14}"
  timeout "${GPU_SUITE_S:-300}" python3 -m pytest $workers -v -rf -m "not slow" \
    -p no:cacheprovider tests > "$OUT/suite.log" 2>&1; echo "rc=$?" >> "$OUT/suite.log"
  grep -E "(FAILED|ERROR) " "$OUT/suite.log" | sort -u > "$OUT/suite_failures.txt"
  mark "done"; exit 0
fi
# 1. the rollout against HF generate and the update's MFU, the decode route CUDA graphs, eager (the main figures);
#    one more step's update profiled (what the MFU is lost to: profile/ and the row's update_profile)
mark "0.6B eager"
timeout 170 python3 benchmarks/gpu_step.py --models qwen3-0.6b --steps 2 --warmup 1 --profile "$OUT/profile" \
  > "$OUT/step_0.6b.jsonl" 2> "$OUT/step_0.6b.err"; echo "rc=$?" >> "$OUT/step_0.6b.err"
# 2. the GPU tests (the graphs against the eager step, bf16 masters, packed kernels, no host sync)
mark "pytest -m gpu"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$OUT/pytest_gpu.log" 2>&1
echo "rc=$?" >> "$OUT/pytest_gpu.log"
# 3. compile that finishes: trainer.compile=true rollout.compile=true, recompiles logged
mark "0.6B compiled"
TORCH_LOGS=recompiles timeout 170 python3 benchmarks/gpu_step.py --models qwen3-0.6b --steps 2 --warmup 1 \
  --compile --no-kernels > "$OUT/step_0.6b_compiled.jsonl" 2> "$OUT/step_0.6b_compiled.err"
echo "rc=$?" >> "$OUT/step_0.6b_compiled.err"
# 4. the other bodies while time is left
left=$(( ${GPU_SESSION_S:-470} - ( $(date +%s) - start ) ))
mark "other bodies, ${left} s left"
if [ "$left" -gt 60 ]; then
  timeout "$left" python3 benchmarks/gpu_step.py --models qwen3-moe,qwen3-1.7b --no-kernels --budget-s $(( left - 60 )) \
    > "$OUT/step_others.jsonl" 2> "$OUT/step_others.err"; echo "rc=$?" >> "$OUT/step_others.err"
fi
mark "done"
