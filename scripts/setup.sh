#!/usr/bin/env bash
# Create .venv with opgen and its test tools. Every install goes through constraints.txt, which
# pins torch, so pip takes the local CPU wheel instead of pulling a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[dev,onnx]"
# Byte-compile opgen now: a run then starts without compiling its modules, also where Python is
# told not to write bytecode itself (PYTHONDONTWRITEBYTECODE).
.venv/bin/python -m compileall -q opgen
