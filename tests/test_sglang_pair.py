"""SGLang 0.5.23 itself, overlap on and off, on this machine (its CPU backend: `torch_native`
attention, float32, SmolLM2-135M) or a GPU: the overlap loop really runs and overlaps (judged by
the host's order of events), the arms give the same tokens, and each SGLang source patch is
caught while stock SGLang stays quiet.

Needs `overlap-harness setup sglang`; elsewhere these tests skip with the reason, and with
OVERLAP_HARNESS_REQUIRE_SGLANG=1 a missing setup fails them."""
import os

import pytest

from harness.oracles.divergence import record_problems, run_logprobs
from harness.oracles.reference import divergences
from harness.workloads import presets as workloads

pytestmark = [pytest.mark.slow, pytest.mark.sglang]
REQUIRED = os.environ.get("OVERLAP_HARNESS_REQUIRE_SGLANG") == "1"


def _unavailable(why: str):
    if REQUIRED:
        pytest.fail(f"SGLang is required here (OVERLAP_HARNESS_REQUIRE_SGLANG=1) but {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module")
def sglang_pair():
    from harness import targets
    from harness.targets import sglang_setup
    from harness.targets.base import TargetUnavailable
    why = sglang_setup.ready()
    if why:
        _unavailable(why)
    try:
        t = targets.make_target("sglang")
        t.start()
    except TargetUnavailable as e:
        _unavailable(str(e))
    yield t
    targets.close_served()


@pytest.fixture
def sglang(sglang_pair):
    """The pair, handed back stock, and a server that died under a test started again when next
    used (one test's crash fails that test only)."""
    from harness import targets
    from harness.search.served_judge import restart_lost
    yield sglang_pair
    if sglang_pair.faults:
        targets.make_target("sglang", ())
    restart_lost(sglang_pair)


@pytest.fixture(scope="module")
def tok(sglang_pair):
    return sglang_pair.tokenizer()


def _workload(tok, seed=0):
    reqs = workloads.mixed(tok, 8, seed=seed)
    for r in reqs:
        r.max_new_tokens = max(r.max_new_tokens, 12)
        r.temperature, r.seed = 0.0, None  # greedy: the arms must agree token for token
    return reqs


def _clear(off, on):
    return [d for _, _, divs in divergences(off, on) for d in divs if not d.near_tie]


def _sched(run, before=False):
    facts = run.summary["facts_before" if before else "facts"]
    return ([f for f in facts if f.get("role") == "sglang-scheduler"] or [{}])[-1]


def test_the_overlap_loop_runs_and_overlaps(sglang, tok):
    on = sglang.run(_workload(tok), overlap=True)  # run() checks the setting and the host order itself
    f = _sched(on)
    assert f["enable_overlap"] is True and f["war_barrier_calls"] > 0, f
    effective, line = sglang.overlap_verdict(on.summary["facts"], on.summary["facts_before"])
    assert effective is True, line
    if sglang.device == "cpu":  # the result copies landed on the agent's copy thread, after the host moved on
        assert f.get("copies_async", 0) > 0, f
    off = sglang.run(_workload(tok), overlap=False)
    g = _sched(off)
    assert g["enable_overlap"] is False and g.get("war_barrier_calls", 0) == 0, g


def test_overlap_on_equals_off(sglang, tok):
    reqs = _workload(tok)
    off, on = sglang.run(reqs, overlap=False), sglang.run(reqs, overlap=True)
    assert not record_problems(on.outputs, run_logprobs(on))
    bad = _clear(off, on)
    assert not bad, bad[0].describe(tok.decode)
    assert sum(len(ids) for _, ids, _ in on.outputs) > 0
    for overlap in (True, False):  # SGLang's own idle check: every row and pool slot back, on both arms
        books = sglang.idle_books(overlap)
        assert books["engine"] is not None, books
        assert books["engine"]["req_rows_held"] == 0 and books["engine"]["pool_leaks"] == 0, books


# the result copy held back longer than a CPU step: it lands after the host launched the next step,
# as a slow copy does on a GPU; the correct engine waits for it (the quiet half below)
SLOW_COPY = {"result_copy": {"p": 1.0, "ms": 400.0}}


def test_a_slow_result_copy_keeps_tokens(sglang, tok):
    """The quiet half of the read-before-copy patch: the same slow copy on stock SGLang."""
    reqs = _workload(tok)
    off, on = sglang.run(reqs, overlap=False), sglang.run(reqs, overlap=True, delays=SLOW_COPY)
    assert not _clear(off, on) and not record_problems(on.outputs, run_logprobs(on))
    assert _sched(on).get("copy_delays", 0) > _sched(on, before=True).get("copy_delays", 0)


@pytest.mark.scheduled
@pytest.mark.parametrize("patch,delays", [("sglang_decode_reads_before_copy", SLOW_COPY),
                                          ("sglang_relay_entry_padded_row", None)])
def test_each_source_patch_is_caught(sglang, tok, patch, delays):
    from harness import targets
    from harness.targets.base import TargetError
    reqs = _workload(tok)
    off = sglang.run(reqs, overlap=False)
    t = targets.make_target("sglang", {patch})
    try:
        on = t.run(reqs, overlap=True, delays=delays)
    except TargetError as e:  # a crash of the patched engine counts only with its own traceback
        if "no traceback" in str(e):  # killed from outside (the OOM killer on a crowded machine)
            raise
        return print(f"{patch}: {e}")
    finally:
        targets.make_target("sglang", ())
    assert _clear(off, on) or record_problems(on.outputs, run_logprobs(on)), f"{patch} went unnoticed"


def _steps(run, target):
    """The run's step books, read again until every request's finish is in (the agent writes a
    finish right after SGLang processed it; the client may have its answer a moment before)."""
    import time
    from harness.agents import plan as planmod
    from harness.oracles import steps
    before = steps.books_of(run.summary["facts_before"])
    recs = steps.new_since(before, steps.books_of(run.summary["facts"]))
    deadline = time.monotonic() + 10
    while any(not r[-1] for r in recs.values()) and time.monotonic() < deadline:
        time.sleep(0.3)
        facts = planmod.read_facts(str(target.facts_dir(run.summary["overlap"])))
        recs = steps.new_since(before, steps.books_of(facts))
    return steps.summed(recs)


def _capped(tok, seed):
    """Requests that end by max_new_tokens only (no stop, no abort): every one is compared."""
    reqs = workloads.mixed(tok, 6, seed=seed)
    for r in reqs:
        r.stop, r.abort_after, r.temperature, r.seed = (), None, 0.0, None
        r.max_new_tokens, r.ignore_eos = 6, True
    return reqs


@pytest.mark.parametrize("patch", [None, pytest.param("sglang_finish_check_late", marks=pytest.mark.scheduled)])
def test_steps_overlap_never_adds_one(sglang, tok, patch):
    """Overlap may save steps, never add them: stock SGLang leaves a request its in-flight result
    finishes out of the next step (counted: path_finish_in_flight); the patch decodes it once more."""
    from harness import targets
    from harness.oracles import steps
    reqs = _capped(tok, seed=3)
    off = sglang.run(reqs, overlap=False)
    t = targets.make_target("sglang", {patch} if patch else ())
    try:
        on = t.run(reqs, overlap=True)
    finally:
        targets.make_target("sglang", ())
    v = steps.compare(reqs, _steps(off, sglang), _steps(on, t))
    assert v.compared == len(reqs), steps.summary_line(v)
    if patch is None:
        assert not v.findings, v.findings
        assert _sched(on).get("path_finish_in_flight", 0) > _sched(on, before=True).get("path_finish_in_flight", 0)
    else:
        assert any("past max_tokens" in f for f in v.findings), (patch, steps.summary_line(v))


# a pair of its own for the paths: a KV pool that cannot hold every request (retraction), prompt
# chunks of 32 tokens (chunked prefill); with penalties, a shared prefix and aborts in the workload
PATHS_ARGS = ["--max-total-tokens", "512", "--chunked-prefill-size", "32", "--max-running-requests", "16"]
COUNTED = ("path_chunked_prefill", "path_prefix_hit", "path_relay_decode", "path_penalties", "path_retraction",
           "path_abort_in_flight")


def _paths_workload(tok):
    from harness.engine.request import Request
    system = tok.encode(workloads.SYSTEM * 3)  # a prompt of several chunks, shared (prefix hits)
    reqs = []
    for i in range(12):
        r = Request(rid=f"p{i}", prompt_ids=system + tok.encode(f" Question {i}: what comes next?"),
                    max_new_tokens=64, arrival=i // 4)
        r.temperature, r.ignore_eos = 0.0, True
        if i % 3 == 1:
            r.repetition_penalty = 1.3
        if i % 6 == 5:
            r.abort_after = 4
        reqs.append(r)
    return reqs


@pytest.mark.scheduled  # a second pair: minutes to start (fast representative: test_overlap_on_equals_off)
def test_every_counted_path_runs_on_both_arms(sglang_pair):
    from harness import targets
    t = targets.make_target("sglang", pair="paths", extra_args=PATHS_ARGS)
    tok = t.tokenizer()
    reqs = _paths_workload(tok)
    runs = {ov: t.run(reqs, overlap=ov) for ov in (False, True)}
    for ov, run in runs.items():
        got, was = _sched(run), _sched(run, before=True)
        missing = [k for k in COUNTED if got.get(k, 0) <= was.get(k, 0)]
        assert not missing, f"overlap {ov}: not exercised: {missing} ({got})"
    on = _sched(runs[True])
    assert on.get("path_finish_in_flight", 0) > 0, on
    bad = _clear(runs[False], runs[True])
    assert not bad, bad[0].describe(tok.decode)
