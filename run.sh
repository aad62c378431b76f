#!/usr/bin/env bash
# One entry point for a fresh machine: creates .venv on first use (torch 2.13.0 CPU build first, so pip
# never pulls CUDA wheels, then literl with its dev extras), re-installs when pyproject.toml changes,
# then runs what you asked for:
#   ./run.sh train [literl train args...]   train on the embedded testbed (default job)
#   ./run.sh test  [pytest args...]         the test suite (what CI runs)
#   ./run.sh <any literl subcommand> ...    e.g. ./run.sh eval --model runs/latest
# Ray (literl[ray], for cluster.address=...) is installed into .venv on first use: by `test`, and by any command
# that sets cluster.address (or --cluster-address).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.literl-setup-stamp
want=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "[literl] setting up $VENV (first run only)..." >&2
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q "torch==${LITERL_TORCH_VERSION:-2.13.0}" >&2
  "$VENV/bin/python" -m pip install -q -e ".[dev]" >&2
  echo "$want" > "$STAMP"
fi
cmd=${1:-train}
shift || true
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
case "$cmd" in
  test) exec "$VENV/bin/python" -m pytest "$@" ;;
  *)    exec "$VENV/bin/literl" "$cmd" "$@" ;;
esac
