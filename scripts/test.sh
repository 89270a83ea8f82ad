#!/usr/bin/env bash
# Set up (idempotent), then run every test: opgen's own and the generated ones.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/opgen check specs -o generated
.venv/bin/python -m pytest -q
