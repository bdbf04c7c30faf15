#!/usr/bin/env bash
# `make test` (= .ci/run): the harness's own tests in two chains side by side, on a 2-core machine.
#   the vLLM chain: `setup vllm` (a no-op once done), then the tests on the one shared server pair in
#     one pytest process (tests/conftest.py orders them), then those with servers of their own;
#   the other chain: every test that needs no real engine on TEST_WORKERS xdist workers (a module to
#     a worker: a module's fixtures are built once);
#   the tests that read vLLM's source without a server (-m vllm_source), once the setup and the
#     release wheels are there, after whichever of those two chains ends its own tests first;
#   the SGLang chain, from the first second: `setup sglang`, then the SGLang pair's tests in
#     one pytest process on its one pair (-m sglang: in .ci/run the stock pair's, in the scheduled
#     tier every one, the source patches' included).
# *Why the setups run beside the tests*: cold, they are minutes of pip work that the first tests do
# not need; started first, beside them, they cost CI no wall time of their own. One real-engine
# pair of each kind at a time: vLLM's in its chain, SGLang's in its own.
# *Why the SGLang chain runs beside the others at their priority*: queued behind the other chain,
# its pair start and tests came after that chain's 14 minutes and ran the cold run past 20 minutes;
# at nice 5 beside it, with the cores full, its cold setup was starved until 606 s and its pair ran
# last and alone (the chain ended at 711 s, the others at 609 and 679 s); at equal priority it is
# done while the others run, and the two-worker chain, which uses both cores, ends the run.
# (SGLANG_NICE sets a nice level for it.)
# `SELECT` picks the tier: "not scheduled" (default, .ci/run) or "scheduled" (make test-scheduled:
# the broad and slow runs whose fast representatives .ci/run keeps).
# Processes rather than xdist groups: under pytest 9.2 xdist's group suffix no longer reaches the
# node ids, so `--dist loadgroup` silently groups nothing.
# *Why .venv is made here (scripts/bootstrap.sh), after the engine chains start*: cold, bootstrap is
# a minute of pip on one core that everything waited for; the engines' venvs need only the standard
# library (setup_vllm / setup_sglang with models=False, run by any Python 3), so their pip work
# starts at the first second beside it, and each chain goes on to `setup` (the model directories,
# which need torch) once .venv is there.
set -uo pipefail
cd "$(dirname "$0")/.."
# *Why bytecode is written during the run*: where PYTHONDONTWRITEBYTECODE is set (this machine's
# container sets it for every process), nothing compiled is kept, and every pytest process (the
# chains' sessions, each xdist worker, each `check` a test starts) rewrote and compiled every test
# module it collected again: a whole collection took 4.9 s of CPU, 1.8 s once pytest's cache is
# written (measured). The caches go in __pycache__ folders, which git ignores.
unset PYTHONDONTWRITEBYTECODE
PY=.venv/bin/python
OH=.venv/bin/overlap-harness
SELECT=${SELECT:-not scheduled}
log=${TEST_VLLM_LOG:-}
if [ -z "$log" ]; then  # a temporary log, printed whole at the end and then removed
  log=$(mktemp -t oh-test-vllm.XXXXXX)
  trap 'rm -rf "$log" "$log.wheels" "$log.sglang" "$log.boot" "$log.src" "$log.src.out"' EXIT
fi
rm -rf "$log.boot" "$log.src" "$log.src.out"
t0=$(date +%s)
since() { echo "$(( $(date +%s) - t0 )) s"; }
# an engine's venv and agent before .venv exists (a failure here is only logged: `setup` redoes it)
early_venv() {
  "${PYTHON:-python3}" -c "from harness.targets.$1.setup import setup_$1; setup_$1(models=False)" \
    || echo "(the early $1 venv failed; setup $1 below makes it)"
}
# a chain waits here for scripts/bootstrap.sh (run below) and stops if it failed
after_bootstrap() {
  while [ ! -s "$log.boot" ]; do sleep 1; done
  [ "$(cat "$log.boot")" = 0 ]
}
# the tests that read vLLM's source (-m vllm_source), once the release wheels and `setup vllm` are
# there, run by whichever of the vLLM chain and the other chain ends its own tests first (the first
# to make the folder $log.src claims them): *why*: run after the other chain, they ended the run
# alone (33 s on both cores after 611 s, where the vLLM chain had ended); beside the chain still
# running they fill the cores it leaves. Their output goes to $log.src.out, printed at the end.
source_tier() {
  mkdir "$log.src" 2>/dev/null || return 0  # the other chain has them
  {
    echo "== the tests that read vLLM's source (-m vllm_source), run by the $1 chain once the setup and the wheels are there ($(since))"
    # (a job that ended without its line, killed or after a failed bootstrap, is waited for no more;
    # in the vLLM chain its own setup line is there already)
    while ! grep -q '^wheels=' "$log.wheels" 2>/dev/null && kill -0 "$wheels_pid" 2>/dev/null; do sleep 1; done
    cat "$log.wheels"
    while ! grep -q '^setup=' "$log" && kill -0 "${vllm_pid:-}" 2>/dev/null; do sleep 1; done
    grep '^setup=' "$log" || true
    "$PY" -m pytest -q -p no:cacheprovider -m "vllm_source and ($SELECT)" -n "${TEST_WORKERS:-2}" --durations=5 "${@:2}"
    echo "src=$?"
    echo "== the tests that read vLLM's source ended at $(since)"
  } >"$log.src.out" 2>&1
}
echo "test: tier '$SELECT'; the vLLM chain (setup, then its tests) runs beside the others; its output is in $log (printed at the end)"
# the release wheels (the vllm_source tests' sources): a download of its own, beside everything
{ after_bootstrap || exit 1; "$OH" setup vllm --wheels; echo "wheels=$?"; } >"$log.wheels" 2>&1 &
wheels_pid=$!
# the SGLang chain: its setup, then its pair's tests (the tier's selection), beside everything;
# SGLANG_SELECT overrides the selection ("" skips the chain: e.g. a machine without the registry)
SGLANG_SELECT=${SGLANG_SELECT-sglang and ($SELECT)}
if [ -n "$SGLANG_SELECT" ]; then
  {
    nice -n "${SGLANG_NICE:-0}" bash -c "$(declare -f early_venv); early_venv sglang"
    after_bootstrap || exit 1
    nice -n "${SGLANG_NICE:-0}" "$OH" setup sglang; echo "sglang_setup=$?"
    echo "== the SGLang pair's tests (-m '$SGLANG_SELECT'), from $(since)"
    OVERLAP_HARNESS_REQUIRE_SGLANG=1 nice -n "${SGLANG_NICE:-0}" "$PY" -m pytest -q -p no:cacheprovider \
      -m "$SGLANG_SELECT" --durations=8 "$@"
    echo "sglang_pair=$?"
    echo "== the SGLang chain ended at $(since)"
  } >"$log.sglang" 2>&1 &
else
  { echo "sglang_setup=0 (not selected)"; echo "sglang_pair=5"; } >"$log.sglang" &
fi
sglang_pid=$!
{
  early_venv vllm
  after_bootstrap || exit 1
  "$OH" setup vllm
  echo "setup=$?"
  echo "== the vLLM tests on the shared pair (-m 'vllm and not own_servers and $SELECT'), from $(since)"
  "$PY" -m pytest -q -p no:cacheprovider -m "vllm and not own_servers and ($SELECT)" --durations=15 "$@"
  echo "pair=$?"
  echo "== the vLLM tests with servers of their own (-m own_servers), from $(since)"
  "$PY" -m pytest -q -p no:cacheprovider -m "vllm and own_servers and ($SELECT)" --durations=5 "$@"
  echo "own=$?"
  echo "== the vLLM chain's own tests ended at $(since)"
  source_tier vLLM "$@"
  echo "== the vLLM chain ended at $(since)"
} >"$log" 2>&1 &
vllm_pid=$!
halt() {  # the chains first (so they start nothing more), then what they are running
  local kids; kids="$(pgrep -P "$vllm_pid") $(pgrep -P "$wheels_pid") $(pgrep -P "$sglang_pid")"
  kill -TERM "$vllm_pid" "$wheels_pid" "$sglang_pid" $kids 2>/dev/null
  wait "$vllm_pid" "$wheels_pid" "$sglang_pid" 2>/dev/null
  for k in $kids; do while kill -0 "$k" 2>/dev/null; do sleep 0.5; done; done
}
stop() { halt; cat "$log"; exit 130; }
trap stop INT TERM
bash scripts/bootstrap.sh
boot=$?
echo "$boot" >"$log.boot"
if [ "$boot" -ne 0 ]; then  # the chains waiting for it end by themselves; the early venvs are stopped
  echo "test: scripts/bootstrap.sh failed (exit $boot)"
  halt
  exit "$boot"
fi
echo "test: .venv ready at $(since)"
"$PY" -m pytest -q -p no:cacheprovider -m "not vllm and not vllm_source and not sglang and ($SELECT)" -n "${TEST_WORKERS:-2}" \
  --dist loadscope --durations=15 "$@"
rest=$?
echo "== the other chain's own tests ended at $(since)"
source_tier other "$@"
echo "== the other chain ended at $(since); waiting for the SGLang chain"
wait "$sglang_pid"
echo "== the SGLang chain ($log.sglang)"
cat "$log.sglang"
sgl=$(sed -n 's/^sglang_pair=//p' "$log.sglang")
wait "$vllm_pid"
trap - INT TERM
echo "== the vLLM chain ($log)"
cat "$log"
cat "$log.src.out" 2>/dev/null
src=$(sed -n 's/^src=//p' "$log.src.out" 2>/dev/null)
sgl_setup=$(sed -n 's/^sglang_setup=\([0-9]*\).*/\1/p' "$log.sglang"); wheels=$(sed -n 's/^wheels=//p' "$log.wheels"); setup=$(sed -n 's/^setup=//p' "$log"); pair=$(sed -n 's/^pair=//p' "$log"); own=$(sed -n 's/^own=//p' "$log")
echo "test: exit $rest (the other tests), ${src:-?} (vLLM's source), ${setup:-?} (setup vllm), ${pair:-?} (the vLLM pair's)," \
  "${own:-?} (the vLLM tests with servers of their own), ${sgl_setup:-?} (setup sglang), ${sgl:-?} (the SGLang pair's), in $(since)"
for rc in "${wheels:-1}" "${setup:-1}" "$rest" "${src:-1}" "${pair:-1}" "${own:-1}" "${sgl_setup:-1}" "${sgl:-1}"; do  # 5: that selection had no test
  [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && exit "$rc"
done
exit 0
