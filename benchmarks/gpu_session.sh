#!/usr/bin/env bash
# Every GPU figure and test in one call (docs/speed.md, "On a GPU" and "GPU decode"), for a lent machine with a
# time budget: each part has its own limit, and what a part printed is kept under $OUT (default ./gpu-out) even
# when a later part is stopped. Carry .whl (benchmarks/gpu_wheels.sh) to a bare image.
#     bash benchmarks/gpu_session.sh            # ≈ 8 minutes on one H100/H200 (GPU_SESSION_S: its budget)
#     GPU_SESSION_S=0 bash benchmarks/gpu_session.sh   # parts 1, 1b and 2 only (≈ 6 minutes on an H100)
#     bash benchmarks/gpu_session.sh suite      # instead: every non-slow test with CUDA present (≈ 4 minutes)
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
fi
# The repository by its absolute path: tests start `python -m literl.cli` and engine processes in other folders.
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
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
# At most 8 files come back from a lent machine: steps.jsonl and steps.err gather every body's row and log.
# 1. the update's MFU targets: the 0.6B and 1.7B bodies with the packed layers compiled (trainer.compile=true,
#    the rollout eager in its CUDA graphs), one more update profiled each (profile/: the top kernels; the row's
#    update_profile: device seconds by kind, kernels, host synchronisations). Two warm-up steps: the one-time costs
#    (compiling, sizing the micro-batches, a back-off after an out-of-memory micro-batch, which on an H200 came
#    in the second step) stay out of the timed ones. Three timed steps: one timed step 10-20% slower than the
#    other, for no reason the log gives, came in two of five 0.6B runs on an H200
#    (results/benchmarks/2026-11-28_h200_gpu-step.md); the
#    median of three sets such a step aside.
for body in qwen3-0.6b qwen3-1.7b; do     # a process each: each body's compile seconds its own
  mark "$body, update compiled"
  timeout 150 python3 benchmarks/gpu_step.py --models $body --steps 3 --warmup 2 --compile-update --no-hf \
    --no-kernels --profile "$OUT/profile" >> "$OUT/steps.jsonl" 2>> "$OUT/steps.err"; echo "rc=$?" >> "$OUT/steps.err"
done
# 1b. the same 0.6B step with each distinct prompt shared in the stream, on the same machine in the same call (off
#     by default: on an H200 its device time is 8-10% lower but its wall time no better,
#     results/benchmarks/2026-11-28_h200_gpu-step.md; an H100,
#     more bound by its device, is where it might pay), profiled beside the whole rows' update
mark "qwen3-0.6b, update compiled, shared prompts"
timeout 150 python3 benchmarks/gpu_step.py --models qwen3-0.6b --steps 3 --warmup 2 --compile-update --no-hf \
  --no-kernels --share-prompts --profile "$OUT/profile" >> "$OUT/steps.jsonl" 2>> "$OUT/steps.err"
echo "rc=$?" >> "$OUT/steps.err"
# 2. the GPU tests (the graphs against the eager step, bf16 masters, packed kernels, compiled packed layers, no host
#    sync in the micro-batch loop)
mark "pytest -m gpu"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests > "$OUT/pytest_gpu.log" 2>&1
echo "rc=$?" >> "$OUT/pytest_gpu.log"
# (and the plugin tests, whose subprocesses need the carried packages' PYTHONPATH: they failed on the GPU image)
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_plugins.py >> "$OUT/pytest_gpu.log" 2>&1
echo "rc=$?" >> "$OUT/pytest_gpu.log"
# 3. eager, each packed attention kernel timed (HF generate against the rollout: measured on an H100:
# results/benchmarks/2026-11-27_h100_gpu-step.md,
#    `--no-hf` saves its ~50 s here); then the MoE while time is left
left=$(( ${GPU_SESSION_S:-470} - ( $(date +%s) - start ) ))
mark "0.6B eager and the MoE, ${left} s left"
if [ "$left" -gt 60 ]; then
  timeout "$left" python3 benchmarks/gpu_step.py --models qwen3-0.6b,qwen3-moe --no-hf --budget-s $(( left - 60 )) \
    >> "$OUT/steps.jsonl" 2>> "$OUT/steps.err"; echo "rc=$?" >> "$OUT/steps.err"
fi
# The timelines in one file: with three profiles, the files under $OUT would pass the 8 that come back.
if ls "$OUT"/profile/*_trace.json.gz >/dev/null 2>&1; then
  tar -cf "$OUT/traces.tar" -C "$OUT/profile" $(cd "$OUT/profile" && ls *_trace.json.gz) && rm "$OUT"/profile/*_trace.json.gz
fi
mark "done"
