#!/usr/bin/env bash
# `make test`: the tests marked vllm in one pytest process (they share one vLLM server pair and
# run in the order tests/conftest.py gives them), everything else beside it in a second one
# (TEST_WORKERS xdist workers, a module to a worker: a module's fixtures are built once).
# Two processes rather than xdist groups: under pytest 9.2 xdist's group suffix no longer reaches
# the node ids, so `--dist loadgroup` silently groups nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
log=${TEST_VLLM_LOG:-}
if [ -z "$log" ]; then  # a temporary log, printed whole at the end and then removed
  log=$(mktemp -t oh-test-vllm.XXXXXX)
  trap 'rm -f "$log"' EXIT
fi
echo "test: the vLLM tests run beside the others; their output is in $log (printed at the end)"
"$PY" -m pytest -q -p no:cacheprovider -m vllm --durations=15 "$@" >"$log" 2>&1 &
vllm_pid=$!
stop() { kill -TERM "$vllm_pid" 2>/dev/null; wait "$vllm_pid" 2>/dev/null; cat "$log"; exit 130; }
trap stop INT TERM
"$PY" -m pytest -q -p no:cacheprovider -m "not vllm" -n "${TEST_WORKERS:-2}" --dist loadscope --durations=15 "$@"
rest=$?
wait "$vllm_pid"
vllm_rc=$?
trap - INT TERM
echo "== the vLLM tests (-m vllm, $log)"
cat "$log"
echo "test: exit $rest (the other tests), $vllm_rc (the vLLM tests)"
[ "$rest" -ne 0 ] && exit "$rest"
exit "$vllm_rc"
