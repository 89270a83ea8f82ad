#!/usr/bin/env bash
# Set up (idempotent), then check: lint and types, and every test (opgen's own and the generated
# ones). The golden comparison (generated/ is what `opgen generate specs` writes) is a test
# (tests/test_cli.py), which shares one generation of specs/ with every test that needs it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check opgen tests benchmarks generated
.venv/bin/ruff format --check opgen tests benchmarks generated
.venv/bin/mypy
.venv/bin/python -m pytest -q -p no:warnings
