#!/usr/bin/env bash
# Create/reuse .venv and install datamill with every extra, pinned by constraints.txt.
# Sourced by scripts/demo.sh and scripts/test.sh. Needs only python3 (3.11).
# Each step prints a line when it starts and its time when it ends; the big install shows pip's progress.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DATAMILL_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"

# step "what" command...: one line before, the elapsed seconds after (and the exit status on failure),
# and every 20 s a line saying it is still running (a big wheel installs for minutes without output).
step() {
  local what="$1" start=$SECONDS status=0 ticker
  shift
  echo "==> $what"
  ( while sleep 20; do echo "    ... $what: $((SECONDS - start)) s"; done ) &
  ticker=$!
  "$@" || status=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  if [ "$status" -ne 0 ]; then
    echo "==> $what: FAILED (exit $status) after $((SECONDS - start)) s"
    return "$status"
  fi
  echo "    $what: done in $((SECONDS - start)) s"
}

PIP=("$PY" -m pip --disable-pip-version-check)
if [ ! -x "$PY" ]; then
  step "create $VENV" python3 -m venv "$VENV"
fi
STAMP="$VENV/.datamill-install-stamp"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ] || ! "$PY" -c "import datamill" 2>/dev/null; then
  echo "==> installing datamill and its pinned dependencies into $VENV (a few minutes on a fresh machine)"
  step "upgrade pip" "${PIP[@]}" install -q --upgrade pip
  # torch first, exactly 2.13.0 (a local CPU wheel here); a plain 'torch' would pull CUDA builds.
  step "install torch==2.13.0" "${PIP[@]}" install --progress-bar off "torch==2.13.0"
  # Not quiet: pip prints each package as it collects and installs it (about a hundred).
  step "install datamill[all] -c constraints.txt" "${PIP[@]}" install --progress-bar off \
    -c "$ROOT/constraints.txt" -e "$ROOT[all]"
  echo "$WANT" > "$STAMP"
else
  echo "==> $VENV is up to date (pyproject.toml and constraints.txt unchanged)"
fi
export PATH="$VENV/bin:$PATH"
