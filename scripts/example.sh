#!/usr/bin/env bash
# Set up (idempotent), regenerate generated/ from specs/, and run a small example with it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/opgen generate specs -o generated
PYTHONPATH=. .venv/bin/python examples/swish_example.py
