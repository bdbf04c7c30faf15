"""The absolute reference (harness.oracles.reference): each request alone, overlap off, serial. Exact on
the correct engine; it catches a bug that corrupts overlap on and off alike."""
from harness.workloads import presets as workloads
from harness.oracles.divergence import compare_runs
from harness.engine.request import Request
from harness.oracles.reference import ABSOLUTE, RELATIVE, absolute_reference, divergences
from harness.targets.ref import RefTarget


def test_alone_equals_batched_on_the_correct_engine():
    t = RefTarget()
    tok = t.tokenizer()
    reqs = workloads.mixed(tok, 8, seed=3)  # stops, an abort, seeded sampling, staggered arrivals
    off, on = t.run(reqs, overlap=False, max_running=4), t.run(reqs, overlap=True, max_running=4)
    ref = absolute_reference(t, reqs, max_running=4)
    assert ref.engine.cfg.max_running == 1 and not ref.engine.cfg.overlap
    assert divergences(off, on, ref) == []
    assert absolute_reference(t, reqs, max_running=4) is ref  # once per workload


def test_a_bug_that_corrupts_on_and_off_alike_is_caught_against_the_reference():
    t = RefTarget(faults={"packed_prefill_slip"})
    tok = t.tokenizer()
    reqs = [Request(f"s{i}", [tok.bos_id] + tok.encode(f"slot {i} " * (i + 1)), max_new_tokens=8) for i in range(4)]
    off, on = t.run(reqs, overlap=False, max_running=4), t.run(reqs, overlap=True, max_running=4)
    assert compare_runs(off, on) == []  # overlap on and off agree: the relative oracle is blind
    found = divergences(off, on, absolute_reference(t, reqs, max_running=4))
    assert [(r, u) for r, u, _ in found] == [(ABSOLUTE, "overlap on"), (ABSOLUTE, "overlap off")]
    assert found[0][2][0].position == 0 and found[0][2][0].labels == ("alone", "overlap on")
    assert RELATIVE not in [r for r, _, _ in found]


def test_stress_names_the_absolute_reference():
    """stress compares a case with the fault-free overlap-off run, then with the requests alone;
    a bug both batched runs share shows only against the second, and the summary says so."""
    from harness.workloads.strategies import Case
    from harness.search.case import _divergence_failure, check, execute
    t = RefTarget()
    tok = t.tokenizer()
    reqs = [Request(f"s{i}", [tok.bos_id] + tok.encode(f"slot {i} " * (i + 1)), max_new_tokens=6) for i in range(4)]
    case = Case({"max_running": 4}, "serial", reqs)
    bug = frozenset({"packed_prefill_slip"})  # stands for a plain code bug of the engine itself
    got = execute(case, faults=bug)
    assert _divergence_failure(execute(case, faults=bug, overlap=False), got, "serial") is None
    alone = execute(Case({"max_running": 1}, "serial", reqs), overlap=False)
    f = _divergence_failure(alone, got, "serial", ABSOLUTE)
    assert f is not None and f"from {ABSOLUTE}" in f.summary and "alone:" in f.detail
    assert check(case)[0] is None  # the correct engine: quiet against both references
