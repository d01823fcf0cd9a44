#!/usr/bin/env bash
# The main job: set up .venv if needed, then run the end-to-end demo on ../shared/data.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$ROOT"
exec datamill demo --data "${DATAMILL_DATA:-$ROOT/../shared/data}" "$@"
