#!/usr/bin/env bash
# `make test`: the vLLM tests in one chain (the shared server pair's tests in one pytest process,
# the pair once, in the order tests/conftest.py gives; then those with servers of their own,
# marked own_servers), and beside it everything else (TEST_WORKERS xdist workers, a module to a
# worker: a module's fixtures are built once). Measured here, the two sides take about as long.
# Processes rather than xdist groups: under pytest 9.2 xdist's group suffix no longer reaches the
# node ids, so `--dist loadgroup` silently groups nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
log=${TEST_VLLM_LOG:-}
if [ -z "$log" ]; then  # a temporary log, printed whole at the end and then removed
  log=$(mktemp -t oh-test-vllm.XXXXXX)
  trap 'rm -f "$log"' EXIT
fi
echo "test: the vLLM tests run beside the others; their output is in $log (printed at the end)"
{
  "$PY" -m pytest -q -p no:cacheprovider -m "vllm and not own_servers" --durations=15 "$@"
  echo "pair=$?"
  echo "== the vLLM tests with servers of their own (-m own_servers)"
  "$PY" -m pytest -q -p no:cacheprovider -m "vllm and own_servers" --durations=5 "$@"
  echo "own=$?"
  # one real-engine pair at a time on two cores: SGLang's pair after vLLM's (its source patches,
  # minutes of restarts each, run in the weekly sglang-cpu workflow)
  echo "== the SGLang pair's tests (-m 'sglang and not sglang_patch')"
  "$PY" -m pytest -q -p no:cacheprovider -m "sglang and not sglang_patch" --durations=5 "$@"
  echo "sgl=$?"
} >"$log" 2>&1 &
vllm_pid=$!
stop() {  # the chain first (so it starts nothing more), then the pytest it is running
  local kids; kids=$(pgrep -P "$vllm_pid")
  kill -TERM "$vllm_pid" $kids 2>/dev/null; wait "$vllm_pid" 2>/dev/null
  for k in $kids; do while kill -0 "$k" 2>/dev/null; do sleep 0.5; done; done
  cat "$log"; exit 130
}
trap stop INT TERM
"$PY" -m pytest -q -p no:cacheprovider -m "not vllm and not sglang" -n "${TEST_WORKERS:-2}" --dist loadscope --durations=15 "$@"
rest=$?
wait "$vllm_pid"
trap - INT TERM
echo "== the vLLM tests (-m vllm, $log)"
cat "$log"
pair=$(sed -n 's/^pair=//p' "$log"); own=$(sed -n 's/^own=//p' "$log"); sgl=$(sed -n 's/^sgl=//p' "$log")
echo "test: exit $rest (the other tests), ${pair:-?} (the vLLM pair's), ${own:-?} (the vLLM tests with servers of their own), ${sgl:-?} (the SGLang pair's)"
for rc in "$rest" "${pair:-1}" "${own:-1}" "${sgl:-1}"; do  # 5: that selection had no test (a path given as an argument)
  [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && exit "$rc"
done
exit 0
