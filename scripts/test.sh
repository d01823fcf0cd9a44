#!/usr/bin/env bash
# The test suite: set up .venv if needed, then run every test (torch and ray included).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
# Browser tests drive Debian's Chromium through playwright (pinned in constraints.txt); never
# `playwright install` (it downloads a browser). Install the distribution package when it is absent.
if [ ! -x /usr/bin/chromium ]; then
  echo "installing Debian's chromium for the browser tests ..."
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
cd "$ROOT"
export DATAMILL_DATA="${DATAMILL_DATA:-$ROOT/../shared/data}"
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
python -m pytest -q -p no:cacheprovider "$@"
