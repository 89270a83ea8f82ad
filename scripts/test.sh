#!/usr/bin/env bash
# Set up (idempotent), then check: generated/ matches specs/, lint and types, and every test
# (opgen's own and the generated ones).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/opgen check specs -o generated
.venv/bin/ruff check opgen tests benchmarks
.venv/bin/ruff format --check opgen tests benchmarks
.venv/bin/mypy
.venv/bin/python -m pytest -q -p no:warnings
