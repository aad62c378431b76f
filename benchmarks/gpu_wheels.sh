#!/usr/bin/env bash
# The pure-Python packages literl needs that a bare GPU image (torch, transformers, tokenizers, safetensors, numpy,
# rich, matplotlib, sympy, pyyaml) lacks, as wheels in .whl/ for a machine that cannot reach a package index.
# Run here (where PyPI is reachable), in the repository root; on the GPU machine:
#     python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# The versions are those ./run.sh installs (.venv); a GPU image with other versions of them keeps its own.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo /.whl/ >> "$exclude"
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
  --platform any -d .whl omegaconf==2.4.0 antlr4-python3-runtime==4.13.2 math-verify==0.9.0 \
  latex2sympy2_extended==1.11.0
ls .whl
