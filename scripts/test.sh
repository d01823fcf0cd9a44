#!/usr/bin/env bash
# The test suite: set up .venv if needed, then run every test (torch and ray included).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$ROOT"
export DATAMILL_DATA="${DATAMILL_DATA:-$ROOT/../shared/data}"
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
python -m pytest -q -p no:cacheprovider "$@"
