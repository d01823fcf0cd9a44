#!/usr/bin/env bash
# Create/reuse .venv and install datamill with every extra, pinned by constraints.txt.
# Sourced by scripts/demo.sh and scripts/test.sh. Needs only python3 (3.11).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DATAMILL_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
fi
STAMP="$VENV/.datamill-install-stamp"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ] || ! "$PY" -c "import datamill" 2>/dev/null; then
  echo "installing datamill and its pinned dependencies into $VENV ..."
  "$PY" -m pip install -q --disable-pip-version-check --upgrade pip
  # torch first, exactly 2.13.0 (a local CPU wheel here); a plain 'torch' would pull CUDA builds.
  "$PY" -m pip install -q --disable-pip-version-check "torch==2.13.0"
  "$PY" -m pip install -q --disable-pip-version-check -c "$ROOT/constraints.txt" -e "$ROOT[all]"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
