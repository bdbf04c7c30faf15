#!/usr/bin/env bash
# The GPU check: run from the repository root (or anywhere: it cds there) on a machine with
# a CUDA device. It
#   1. picks a python whose torch has CUDA: .venv when its torch has CUDA, else a venv in
#      .cache/venv-gpu built with --system-site-packages over a system CUDA torch, else a
#      plain venv that pip-installs torch (needs the network);
#   2. installs the project with --no-deps (never a new torch) and only the pure-python
#      dependencies that are missing;
#   3. prints nvidia-smi -L and the torch / CUDA versions;
#   4. runs pytest -q -m gpu tests/;
#   5. runs `overlap-harness run --prompt hello --max-tokens 8 --json` on --device cuda and on
#      --device sim and compares the token ids (MATCH / MISMATCH).
# Exits non-zero if any step fails. Everything is also logged to ${OUT:-/tmp/gpu-check}/gpu-check.log.
# About 1-3 minutes on an H200 with a system CUDA torch (no downloads).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUTDIR=${OUT:-/tmp/gpu-check}
mkdir -p "$OUTDIR"
LOG=$OUTDIR/gpu-check.log
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!

failures=0
fail() { echo "gpu-check: FAIL: $*"; failures=$((failures + 1)); }
step() { echo; echo "== $*"; }
finish() {
  echo
  if [ "$failures" -eq 0 ]; then echo "gpu-check: OK (log: $LOG)"; else echo "gpu-check: $failures failure(s) (log: $LOG)"; fi
  exec 1>&- 2>&-  # let tee see the end of its input and finish the log first
  wait "$TEE_PID" 2>/dev/null
  [ "$failures" -eq 0 ]
  exit $?
}

has_cuda_torch() { "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }

# -- 1. a python with CUDA torch --------------------------------------------------------------
step "python with a CUDA torch"
PY=${PYTHON:-python3}
if [ -x .venv/bin/python ] && has_cuda_torch .venv/bin/python; then
  VENV=.venv
  echo "using .venv (its torch has CUDA)"
else
  VENV=${GPU_VENV:-.cache/venv-gpu}
  if [ ! -x "$VENV/bin/python" ]; then
    if has_cuda_torch "$PY"; then
      echo "creating $VENV over the system torch of $PY (--system-site-packages)"
      "$PY" -m venv --system-site-packages "$VENV" || { fail "python -m venv"; finish; }
    else
      echo "creating $VENV ($PY has no CUDA torch; torch will be installed with pip)"
      "$PY" -m venv "$VENV" || { fail "python -m venv"; finish; }
    fi
  else
    echo "using $VENV"
  fi
fi
VPY=$VENV/bin/python
pip=("$VPY" -m pip install -q --disable-pip-version-check)
if ! has_cuda_torch "$VPY"; then
  echo "installing torch into $VENV (no CUDA torch there)"
  timeout 240 "${pip[@]}" torch || { fail "pip install torch (a CUDA torch is needed; offline machines need a system one)"; finish; }
  has_cuda_torch "$VPY" || { fail "torch in $VENV does not see a CUDA device"; finish; }
fi

# -- 2. the project, without touching torch ----------------------------------------------------
step "install overlap-harness (--no-deps)"
missing=()
for spec in numpy:numpy pytest:pytest hypothesis:hypothesis matplotlib:matplotlib psutil:psutil; do
  mod=${spec%%:*} pkg=${spec##*:}
  "$VPY" -c "import $mod" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  timeout 180 "${pip[@]}" "${missing[@]}" || fail "pip install ${missing[*]}"
fi
# no build isolation first: an offline machine cannot fetch setuptools into an isolated env
if ! timeout 120 "${pip[@]}" --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
   && ! timeout 120 "${pip[@]}" --no-deps -e .; then
  echo "gpu-check: warning: pip install -e . failed; using PYTHONPATH=$ROOT and python -m harness.cli"
fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
if [ -x "$VENV/bin/overlap-harness" ]; then OH=("$VENV/bin/overlap-harness"); else OH=("$VPY" -m harness.cli); fi

# -- 3. what this machine is -----------------------------------------------------------------------
step "device"
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L || fail "nvidia-smi -L"; else echo "(nvidia-smi not on PATH)"; fi
"$VPY" - <<'EOF' || fail "torch cannot use the CUDA device"
import torch
print(f"torch {torch.__version__}  CUDA {torch.version.cuda}  cuDNN {torch.backends.cudnn.version()}")
print(f"device 0: {torch.cuda.get_device_name(0)}  capability {torch.cuda.get_device_capability(0)}  "
      f"count {torch.cuda.device_count()}")
torch.ones(1, device="cuda").add_(1).item()
EOF

# -- 4. the gpu tests ------------------------------------------------------------------------------
step "pytest -q -m gpu tests/"
timeout 240 "$VPY" -m pytest -q -m gpu -rs -p no:cacheprovider --junitxml "$OUTDIR/pytest-gpu.xml" tests/ \
  || fail "pytest -m gpu (exit $?)"

# -- 5. the CLI on cuda and on the sim ---------------------------------------------------------------
step "overlap-harness run: cuda vs sim"
for dev in cuda sim; do
  timeout 120 "${OH[@]}" run --device "$dev" --prompt "hello" --max-tokens 8 --json \
    >"$OUTDIR/run-$dev.json" 2>"$OUTDIR/run-$dev.err" || { fail "run --device $dev (exit $?)"; cat "$OUTDIR/run-$dev.err"; }
done
"$VPY" - "$OUTDIR/run-cuda.json" "$OUTDIR/run-sim.json" <<'EOF' || fail "token ids differ between cuda and sim"
import json, sys
def ids(path):
    try:
        with open(path) as f:
            doc = json.loads(f.read().strip().splitlines()[-1])
        return [o["token_ids"] for o in doc["outputs"]], doc.get("summary", {})
    except Exception as e:  # no output, or not the JSON we expect
        print(f"{path}: no token ids ({type(e).__name__}: {e})")
        return None, {}
cuda, cs = ids(sys.argv[1])
sim, _ = ids(sys.argv[2])
print("cuda:", cuda)
print("sim: ", sim)
if cs:
    print("cuda summary:", {k: cs[k] for k in ("steps", "step_ms", "period_ms", "gpu_idle_gap_ms", "host_stall_ms") if k in cs})
ok = cuda is not None and cuda == sim
print("MATCH" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
EOF

finish
