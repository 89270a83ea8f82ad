#!/usr/bin/env bash
# Create .venv with opgen and its test tools. torch is pinned (see pyproject.toml) so pip
# takes the local CPU wheel instead of pulling a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install --quiet --disable-pip-version-check "torch==2.13.0"
.venv/bin/pip install --quiet --disable-pip-version-check -e ".[dev]"
