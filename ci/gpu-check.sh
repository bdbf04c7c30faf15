#!/usr/bin/env bash
# The GPU check: run from the repository root (or anywhere: it cds there) on a machine with
# a CUDA device. It
#   0. stops at once, saying "no GPU", where there is no CUDA device (exit 2: nothing checked);
#   1. picks a python whose torch has CUDA: .venv when its torch has CUDA, else a venv in
#      .cache/venv-gpu built with --system-site-packages over a system CUDA torch, else a
#      plain venv that pip-installs torch (needs the network);
#   2. installs the project with --no-deps (never a new torch) and only the pure-python
#      dependencies that are missing;
#   3. prints nvidia-smi -L and the torch / CUDA versions;
#   4. runs pytest -q -m gpu tests/;
#   5. runs `overlap-harness run --prompt hello --max-tokens 8 --json` on --device cuda and on
#      --device sim and compares the token ids (MATCH / MISMATCH);
#   6. `overlap-harness check --device cuda --seeds 1`: every suite against the ref engine on the GPU;
#   7. `overlap-harness sanitize -- overlap-harness run --device cuda ...` (memcheck), when
#      compute-sanitizer is found (PATH, $CUDA_HOME/bin, the nvidia-cuda-sanitizer-api wheel);
#   8. the SGLang smoke (tests/test_sglang_target.py, a real overlap on/off server pair), when
#      sglang is importable and OVERLAP_HARNESS_SGLANG_MODEL names a model;
#   9. the vLLM gate on vLLM's V2 model runner: `check --target vllm --vllm-python PY` against the
#      vLLM a GPU image already has (OVERLAP_HARNESS_VLLM_PYTHON, else this venv's python when it
#      imports vllm). On a CUDA build V2 is vLLM's default runner: no Triton interpreter, no
#      overlay, none of our CPU adaptations (docs/vllm-v2.md); the step fails unless the gate
#      passes, its JSON names the V2 runner from the servers' logs, and no interpreter ran.
#  10. beyond one worker (issue 45, docs/multi-worker.md): on a machine with two or more GPUs, the
#      same vLLM's gate in the multi-worker configurations, `check --target vllm --vllm-python PY
#      --configs tp2,pp2` (tensor parallelism, pipeline parallelism on V2: every rank's books and
#      overlap judged and named); skipped with one line on a single GPU. With three or more GPUs,
#      `check --configs pp3-v1 --fault v1_pp_async_allowed` too: it must not pass, by its structured_output
#      row (vllm#45014's "Failed to advance FSM") or a HANG that names the rank that raised (on CPU: 3 of 7
#      runs FAIL that row, 4 HANG with stage 0's IndexError on a placeholder id; docs/multi-worker.md).
#  11. speculative decoding with the overlap on (issue 43, docs/vllm-spec.md, docs/sglang-spec.md):
#      the same vLLM's gate with its drafters, `check --target vllm --vllm-python PY --configs
#      spec-draft,spec-same` (draft-model windows, on a CUDA build: none of our CPU workarounds),
#      and, where sglang is installed, `check --target sglang --configs ngram,standalone` (SGLang's
#      own spec-v2 overlap loop, which its CUDA build keeps on: NGRAM, and STANDALONE, a draft model,
#      which cannot start on our CPUs: harness/targets/sglang/spec.py STANDALONE_CPU).
# It ends with one line per step (PASS / FAIL / SKIP and why) and a verdict; exits non-zero if
# any step fails. Everything is also logged to ${OUT:-/tmp/gpu-check}/gpu-check.log.
# Steps 1-5 take 1-3 minutes on an H200 with a system CUDA torch (no downloads); 6 several more.
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
results=()  # one "STATUS  step: detail" line per step, printed at the end
current=""
fail() { echo "gpu-check: FAIL: $*"; failures=$((failures + 1)); results+=("FAIL  ${current:-setup}: $*"); }
skip() { echo "gpu-check: SKIP: $*"; results+=("SKIP  $current: $*"); }
pass() { results+=("PASS  $current${1:+: $1}"); }
last_failed() { [ ${#results[@]} -gt 0 ] && [ "${results[-1]:0:4}" = "FAIL" ]; }
step() { current=$1; echo; echo "== $*"; }
finish() {
  echo
  echo "== summary"
  for r in "${results[@]}"; do echo "$r"; done
  if [ "$failures" -eq 0 ]; then echo "gpu-check: OK (log: $LOG)"; else echo "gpu-check: $failures failure(s) (log: $LOG)"; fi
  exec 1>&- 2>&-  # let tee see the end of its input and finish the log first
  wait "$TEE_PID" 2>/dev/null
  [ "$failures" -eq 0 ]
  exit $?
}

has_cuda_torch() { "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }

# -- 0. is there a GPU at all? ----------------------------------------------------------------
# nvidia-smi listing a device, or a python here whose torch sees one; otherwise stop before
# building anything (a CPU machine would otherwise download a CUDA torch it cannot use)
gpu_seen=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then gpu_seen="nvidia-smi"; fi
for cand in .venv/bin/python "${PYTHON:-python3}"; do
  if [ -z "$gpu_seen" ] && command -v "$cand" >/dev/null 2>&1 && has_cuda_torch "$cand"; then
    gpu_seen="the torch of $cand"
  fi
done
if [ -z "$gpu_seen" ]; then
  echo "gpu-check: no GPU: nvidia-smi lists no device and no python here has a torch that sees CUDA;" \
       "nothing was checked (run this on a machine with an NVIDIA GPU)"
  exec 1>&- 2>&-
  wait "$TEE_PID" 2>/dev/null
  exit 2
fi

# -- 1. a python with CUDA torch --------------------------------------------------------------
step "python with a CUDA torch" "($gpu_seen sees a GPU)"
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
pass "$VENV"
echo "$ROOT/$VENV" >"$OUTDIR/venv"  # later workflow steps use the same python

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
last_failed || pass

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
last_failed || pass "$(nvidia-smi -L 2>/dev/null | head -1)"

# -- 4. the gpu tests ------------------------------------------------------------------------------
step "pytest -q -m gpu tests/"
if timeout 240 "$VPY" -m pytest -q -m gpu -rs -p no:cacheprovider --junitxml "$OUTDIR/pytest-gpu.xml" tests/; then
  pass "$OUTDIR/pytest-gpu.xml"
else
  fail "pytest -m gpu (exit $?)"
fi

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
last_failed || pass "token ids MATCH"

# -- 6. every suite against the ref engine on the GPU -------------------------------------------
step "overlap-harness check --device cuda"
if timeout 900 "${OH[@]}" check --device cuda --seeds 1 --junit "$OUTDIR/check-cuda.xml"; then
  pass "$OUTDIR/check-cuda.xml"
else
  fail "check --device cuda (exit $?)"
fi

# -- 7. compute-sanitizer over a GPU run ---------------------------------------------------------
step "overlap-harness sanitize (memcheck)"
if "$VPY" -c 'from harness.oracles.sanitizer import find_sanitizer; print(find_sanitizer())' 2>/dev/null; then
  if timeout 600 "${OH[@]}" sanitize --tool memcheck --junit "$OUTDIR/sanitize-memcheck.xml" \
       --log "$OUTDIR/sanitize-memcheck.log" -- "${OH[@]}" run --device cuda --prompt hello --max-tokens 8; then
    pass "$OUTDIR/sanitize-memcheck.xml"
  else
    fail "sanitize memcheck (exit $?; report $OUTDIR/sanitize-memcheck.log)"
  fi
else
  skip "compute-sanitizer not found (PATH, \$CUDA_HOME/bin or pip install nvidia-cuda-sanitizer-api)"
fi

# -- 8. the SGLang smoke ------------------------------------------------------------------------
step "SGLang overlap on/off pair"
if ! "$VPY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("sglang") is None)' 2>/dev/null; then
  skip "sglang is not installed in $VENV (pip install sglang==0.5.23)"
elif [ -z "${OVERLAP_HARNESS_SGLANG_MODEL:-}" ]; then
  skip "set OVERLAP_HARNESS_SGLANG_MODEL to a small model (a path or a Hugging Face id)"
elif timeout 1500 "$VPY" -m pytest -q -m gpu -rs -p no:cacheprovider --junitxml "$OUTDIR/sglang.xml" \
       tests/test_sglang_target.py; then
  pass "$OUTDIR/sglang.xml"
else
  fail "SGLang smoke (exit $?)"
fi

# -- 9. the vLLM gate on the V2 model runner ----------------------------------------------------
step "vLLM gate on the V2 runner (the image's vLLM)"
VLLM_PY=${OVERLAP_HARNESS_VLLM_PYTHON:-}
if [ -z "$VLLM_PY" ] && "$VPY" -c 'import vllm' >/dev/null 2>&1; then VLLM_PY=$VPY; fi
if [ -z "$VLLM_PY" ]; then
  skip "no vLLM here: set OVERLAP_HARNESS_VLLM_PYTHON to a python whose vllm is a CUDA build (pip install vllm)"
elif "$VLLM_PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  # auto: the runner that build runs for its users (V2 wherever vLLM counts Triton usable)
  if timeout 2400 "${OH[@]}" check --target vllm --vllm-python "$VLLM_PY" --json "$OUTDIR/vllm-v2.json" \
       --junit "$OUTDIR/vllm-v2.xml" --out "$OUTDIR/vllm-v2-out"; then
    if "$VPY" - "$OUTDIR/vllm-v2.json" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1])).get("vllm") or {}
print("gpu-check: ran:", v.get("ran"))
ok = v.get("runner") == ["v2"] and "interpreter" not in (v.get("ran") or "") and v.get("source") == "user"
sys.exit(0 if ok else 1)
EOF
    then pass "$OUTDIR/vllm-v2.json"; else fail "the gate passed but not on the image's vLLM with V2 (see $OUTDIR/vllm-v2.json)"; fi
  else
    fail "check --target vllm --vllm-python $VLLM_PY (exit $?; $OUTDIR/vllm-v2.json)"
  fi
else
  skip "$VLLM_PY's torch sees no CUDA device: not a GPU build of vLLM"
fi

# -- 10. beyond one worker: TP and PP with the overlap on ------------------------------------------
step "vLLM gate beyond one worker (tp2, pp2)"
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ -z "$VLLM_PY" ]; then
  skip "no vLLM here (step 9)"
elif [ "${NGPU:-0}" -lt 2 ]; then
  skip "$NGPU GPU(s): tp2 and pp2 need two"
elif timeout 2400 "${OH[@]}" check --target vllm --vllm-python "$VLLM_PY" --configs tp2,pp2 \
       --json "$OUTDIR/vllm-multi.json" --out "$OUTDIR/vllm-multi-out"; then
  pass "$OUTDIR/vllm-multi-tp2.json, $OUTDIR/vllm-multi-pp2.json"
else
  fail "check --target vllm --configs tp2,pp2 (exit $?; $OUTDIR/vllm-multi-*.json)"
fi
# vllm#45014 re-created (V1's refusal of PP + async lifted) needs two batches in flight at a
# schedule: PP=3 on V1. On CPU it is caught either way (docs/multi-worker.md): the structured_output
# row FAILs, or the engine HANGs with the first stage's exception named. Here: the same, on three GPUs
if [ -n "$VLLM_PY" ] && [ "${NGPU:-0}" -ge 3 ]; then
  timeout 2400 "${OH[@]}" check --target vllm --vllm-python "$VLLM_PY" --configs pp3-v1 --fault v1_pp_async_allowed \
    --json "$OUTDIR/vllm-pp3v1.json" --out "$OUTDIR/vllm-pp3v1-out"
  if how=$(python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
so = [c for c in d.get('cases', []) if c.get('status') == 'FAIL' and 'structured_output' in c.get('id', '')]
raised = [str(h) for h in d.get('hangs', []) if 'raised while it stalled' in str(h)]
print('structured_output FAILs' if so else 'HANG: ' + raised[0] if raised else '')
sys.exit(0 if so or raised else 1)" "$OUTDIR/vllm-pp3v1-pp3-v1.json" 2>/dev/null); then
    pass "pp3-v1 + v1_pp_async_allowed caught: $how ($OUTDIR/vllm-pp3v1-pp3-v1.json)"
  else
    fail "pp3-v1 + v1_pp_async_allowed: neither a structured_output FAIL nor a named HANG ($OUTDIR/vllm-pp3v1-pp3-v1.json)"
  fi
elif [ -n "$VLLM_PY" ]; then
  echo "gpu-check: $NGPU GPU(s): pp3-v1 (vllm#45014 re-created) needs three: not run"
fi

# -- 11. speculative decoding with the overlap on ----------------------------------------------------
step "speculative decoding with the overlap on (vLLM drafters; SGLang NGRAM, STANDALONE)"
spec_fail=""
if [ -z "$VLLM_PY" ]; then
  echo "gpu-check: no vLLM here (step 9): its drafters not run"
elif ! timeout 2400 "${OH[@]}" check --target vllm --vllm-python "$VLLM_PY" --configs spec-draft,spec-same \
       --json "$OUTDIR/vllm-spec.json" --out "$OUTDIR/vllm-spec-out"; then
  spec_fail="check --target vllm --configs spec-draft,spec-same (exit $?; $OUTDIR/vllm-spec-*.json)"
fi
if "$VPY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("sglang") is None)' 2>/dev/null; then
  if ! timeout 2400 "${OH[@]}" check --target sglang --configs ngram,standalone --json "$OUTDIR/sglang-spec.json" \
         --out "$OUTDIR/sglang-spec-out"; then
    spec_fail="${spec_fail:+$spec_fail; }check --target sglang --configs ngram,standalone (exit $?; $OUTDIR/sglang-spec-*.json)"
  fi
else
  echo "gpu-check: sglang is not installed in $VENV: its drafters (NGRAM, STANDALONE) not run"
fi
if [ -n "$spec_fail" ]; then fail "$spec_fail"
elif [ -z "$VLLM_PY" ] && ! "$VPY" -c 'import sglang' >/dev/null 2>&1; then skip "neither vLLM nor SGLang here"
else pass "$OUTDIR/vllm-spec-*.json $OUTDIR/sglang-spec-*.json"; fi

finish
