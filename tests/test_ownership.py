"""The device-side slot-ownership check (harness/hazards/ownership.py): quiet on the correct
engine, and it catches what the other oracles cannot: pages freed before a dispatched step ran
while the tokens stay exactly right (the vllm-ascend #13501 class), and a speculative window
that runs past the reservation while the CPU's own reservation check sees nothing wrong."""
import pytest

from harness.workloads import presets as workloads
from harness.hazards.ownership import KV_PREFIXES, check
from harness.targets.ref import RefTarget


@pytest.fixture(scope="module")
def tok():
    return RefTarget().tokenizer()


def run(tok, faults=(), **kw):
    reqs = workloads.row_reuse(tok, n=8)
    return RefTarget(faults).run(reqs, overlap=True, track=KV_PREFIXES, max_running=3, **kw)


def test_quiet_on_the_correct_engine_plain_and_speculative(tok):
    for kw in ({}, {"page_size": 4}, {"spec": "oracle", "spec_k": 3, "spec_wrong": 0.2}):
        r = run(tok, **kw)
        assert any(a.write for a in r.tracker.log), "no KV write was logged"
        assert check(r.tracker.log) == [], kw


def test_early_free_caught_while_tokens_stay_right(tok):
    good, bad = run(tok), run(tok, {"early_free"})
    assert bad.outputs == good.outputs, "the fault should leave the tokens alone (the point of this oracle)"
    assert not bad.hazards
    v = check(bad.tracker.log)
    assert v, "pages freed before their last step ran went unseen"
    assert "released it" in str(v[0]) and f"step {v[0].step}" in str(v[0])


def test_window_past_reservation_caught_where_the_cpu_check_is_blind(tok):
    r = run(tok, {"window_off_by_one"}, spec="oracle", spec_k=3, spec_wrong=0.2)
    assert not r.engine.sched.violations, "the CPU's view of the window is right under this fault"
    v = check(r.tracker.log)
    assert v and v[0].write and v[0].who.startswith("request ")


def test_a_padded_row_writing_a_live_slot_is_caught(tok):
    # entry / row 0 handed to a request: padded rows (row 0) then write that request's slots
    v = check(run(tok, {"live_entry_zero"}, spec="oracle", spec_k=3).tracker.log)
    assert v and v[0].who == "a padded row"
