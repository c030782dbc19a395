#!/usr/bin/env bash
# Create .venv and install mxq with its test extra. Idempotent and quick when nothing changed.
# torch: reuse one the base interpreter already has (venv with system site-packages); otherwise
# install torch==2.13.0 first, which is a CPU build where a local wheel exists and PyPI's build
# elsewhere, so pip never resolves an unpinned torch to a multi-GB download by accident.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  if "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m venv --system-site-packages .venv
  else
    "$PY" -m venv .venv
  fi
fi
stamp=.venv/.mxq-installed
want=$(cat pyproject.toml .ci/setup.sh | sha256sum | cut -c1-16)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]] && .venv/bin/python -c "import mxq, torch, cutlass, tvm_ffi, jinja2, pytest" >/dev/null 2>&1; then
  exit 0
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".[test]"
echo "$want" >"$stamp"
