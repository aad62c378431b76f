#!/usr/bin/env bash
# One entry point for a fresh machine: creates .venv on first use (torch 2.13.0 CPU build first, so pip
# never pulls CUDA wheels, then literl: the core for every command, plus its dev extras for `test`),
# re-installs when pyproject.toml changes, then runs what you asked for:
#   ./run.sh train [literl train args...]   train on the embedded testbed (default job)
#   ./run.sh test  [pytest args...]         the test suite (what CI runs)
#   ./run.sh <any literl subcommand> ...    e.g. ./run.sh eval --model runs/latest
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
  "$VENV/bin/python" -m pip install -q "torch==${LITERL_TORCH_VERSION:-2.13.0}" >&2
  "$VENV/bin/python" -m pip install -q -e ".$extras" >&2
  echo "$hash$extras" > "$STAMP"
fi
case "$cmd" in
  test) exec "$VENV/bin/python" -m pytest "$@" ;;
  *)    exec "$VENV/bin/literl" "$cmd" "$@" ;;
esac
