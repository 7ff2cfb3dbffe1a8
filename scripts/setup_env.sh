#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment at .venv with the pinned, tested pair
# megatron-bridge 0.6.2 + megatron-core 0.19.2 on Python 3.12, and install this package editable.
#
# Why not `pip install megatron-bridge`: its declared dependencies cannot be resolved on a CPU
# machine (fast-hadamard-transform is sdist-only and needs torch at build time; the resolver then
# backtracks megatron-core). We install it with --no-deps plus the few packages its import path
# really needs (requirements-ci.txt).
#
# Idempotent: a second run on a ready machine only checks the stamp and exits in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
MB_VERSION=0.6.2

# A candidate counts only if it really runs as 3.12 (a pyenv shim on PATH may exist and still fail).
works() { [ -n "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; }
find_python312() {
  local c
  for c in ${PYTHON312:-} \
           $( (command -v pyenv >/dev/null 2>&1 && ls -d "$(pyenv root)"/versions/3.12*/bin/python3.12 2>/dev/null | sort -V -r) || true) \
           $(command -v python3.12 2>/dev/null || true) /usr/bin/python3.12 /usr/local/bin/python3.12; do
    if works "$c"; then echo "$c"; return 0; fi
  done
  return 1
}

# The megatron-core wheel's datasets folder lacks the Makefile MB's initialize runs (`doctor` reports
# it): add the no-op one (scripts/dataset_makefile.sh owns its text). Also on a ready venv: cheap.
datasets_makefile() {
  local ds
  ds=$("$VENV/bin/python" -c 'import importlib.util, os; s = importlib.util.find_spec("megatron.core"); print(os.path.join(list(s.submodule_search_locations)[0], "datasets"))' 2>/dev/null) \
    && bash scripts/dataset_makefile.sh "$ds"
}

STAMP_CONTENT="torch=$TORCH_VERSION mb=$MB_VERSION $(sha256sum requirements-ci.txt pyproject.toml | sha256sum | cut -c1-16)"
if [ -f "$VENV/.setup-stamp" ] && [ "$(cat "$VENV/.setup-stamp")" = "$STAMP_CONTENT" ]; then
  datasets_makefile
  echo "setup_env: $VENV is ready ($STAMP_CONTENT)"
  exit 0
fi

PY=$(find_python312) || { echo "setup_env: Python 3.12 not found (tried python3.12 on PATH and pyenv versions). megatron-bridge >= 0.4 requires Python 3.12." >&2; exit 1; }
echo "setup_env: using $PY ($("$PY" --version))"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
"${PIP[@]}" "torch==$TORCH_VERSION"
"${PIP[@]}" -r requirements-ci.txt
"${PIP[@]}" --no-deps "megatron-bridge==$MB_VERSION"
"${PIP[@]}" --no-deps -e .
datasets_makefile
echo "$STAMP_CONTENT" > "$VENV/.setup-stamp"
echo "setup_env: ready at $VENV"
