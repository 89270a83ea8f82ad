#!/usr/bin/env bash
# The generated tests of specs/ (the committed package generated/) on the lowest torch release
# opgen declares, in a second environment .venv-floor (idempotent). The main suite
# (scripts/test.sh) tests the release constraints.txt pins; together they test both ends of the
# declared range.
#
# On Linux the package index serves torch's CUDA build (with its nvidia-* wheels, several GB);
# it runs on a machine without a GPU as the CPU build does. pip's own configuration chooses the
# index: set PIP_INDEX_URL / PIP_EXTRA_INDEX_URL to take a CPU-only build from elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv-floor/bin/python ]; then
  python3 -m venv .venv-floor
fi
.venv-floor/bin/pip install --quiet --disable-pip-version-check -c constraints-floor.txt torch "pytest>=8"
# The generated package needs torch alone (torch warns, once, that NumPy is missing: it is).
.venv-floor/bin/python -W ignore -c 'import torch; print(f"torch {torch.__version__} in .venv-floor")'
.venv-floor/bin/python -m pytest -q -p no:cacheprovider -p no:warnings generated/tests
