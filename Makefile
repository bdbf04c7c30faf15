# `make check` and `make test` each build .venv on first use (scripts/bootstrap.sh); `make test`
# also sets up the vLLM target (its own venv and model, in the user cache; a no-op once done).
PY := .venv/bin/python
OH := .venv/bin/overlap-harness

.PHONY: check test run bench venv vllm
venv:
	@bash scripts/bootstrap.sh

vllm: venv
	@$(OH) setup vllm

check: venv
	$(OH) check

run: venv
	$(OH) run --prompt "The overlap scheduler" --prompt "Write one step ahead" --max-tokens 24

test: venv vllm
	$(PY) -m pytest -q -p no:cacheprovider --durations=25

bench: venv
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done
	@echo "== every benchmark against its anchor, side by side (benchmarks/table.py)"; $(PY) benchmarks/table.py
