#!/usr/bin/env bash
# The test suite: set up .venv if needed, lint (ruff, mypy strict), build the docs site strictly,
# then run every test (torch and ray included). Extra arguments go to pytest.
# DATAMILL_LINT=0 skips the lint and docs steps (for a quick local rerun of some tests).
set -euo pipefail
START=$SECONDS
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$ROOT"
# Browser tests drive Debian's Chromium through playwright (pinned in constraints.txt); never
# `playwright install` (it downloads a browser). Install the distribution package when it is absent.
install_chromium() {
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
}
if [ ! -x /usr/bin/chromium ]; then
  step "install Debian's chromium (for the browser tests)" install_chromium
fi
# The server's deployment tests run a real Prometheus (scraping /metrics) and a real nginx (terminating
# TLS in front of the server), both Debian packages started on loopback by the tests themselves.
install_prometheus_nginx() {
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus nginx-light >/dev/null
}
if [ ! -x /usr/bin/prometheus ] || [ ! -x /usr/sbin/nginx ]; then
  step "install Debian's prometheus and nginx (for the metrics and TLS proxy tests)" install_prometheus_nginx
fi
# The multi-host test (tests/faults/test_netns.py) puts the server, the store and the clients in
# Linux network namespaces with `ip` (iproute2); as root it runs, elsewhere it skips.
install_iproute2() {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 >/dev/null
}
if [ "$(id -u)" -eq 0 ] && ! command -v ip >/dev/null 2>&1; then
  step "install Debian's iproute2 (for the network-namespace test)" install_iproute2
fi
# The systemd unit test runs `systemd-analyze verify --root=...` on deploy/datamill-serve.service as
# shipped (no systemd needs to run: the package only provides the tool and the unit files it checks).
install_systemd() {
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends systemd >/dev/null
}
if ! command -v systemd-analyze >/dev/null; then
  step "install Debian's systemd (systemd-analyze, for the unit file test)" install_systemd
fi
export DATAMILL_DATA="${DATAMILL_DATA:-$ROOT/../shared/data}"
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
if [ "${DATAMILL_LINT:-1}" != "0" ]; then
  step "lint: ruff check src tests benchmarks" ruff check --no-cache src tests benchmarks
  step "lint: ruff format --check src tests benchmarks scripts" ruff format --check --no-cache src tests benchmarks scripts
  step "lint: mypy --strict (pyproject's [tool.mypy])" python -m mypy
  SITE="$(mktemp -d)"
  # NO_MKDOCS_2_WARNING: the theme's banner about its successor, printed on every build.
  step "docs: mkdocs build --strict" env NO_MKDOCS_2_WARNING=1 mkdocs build --strict -d "$SITE"
  rm -rf "$SITE"
fi
# --durations=40: every log shows the slowest tests (the suite must stay under 15 min on 2 cores).
step "tests: pytest $*" python -m pytest -q -p no:cacheprovider --durations=40 "$@"
echo "==> all steps passed in $((SECONDS - START)) s"
