"""End to end on the tiny model: overlap on and off give identical tokens."""
import pytest

from harness.workloads import presets as workloads
from harness.engine.build import build_engine
from harness.engine.config import EngineConfig
from harness.engine.request import Request, State

POLICIES = ["serial", "random:1", "random:2", "pct:3:3", "pct:4:2", "delay:forward:2", "delay:copy:3",
            "delay:schedule:1"]


def run(reqs=None, **kw):
    eng, tok = build_engine(EngineConfig(**kw))
    reqs = reqs if reqs is not None else workloads.mixed(tok, 10)
    log = []
    eng.run(reqs, on_step=lambda e: log.append(e.sched.accounting()))
    return eng, reqs, log


def outputs(reqs):
    return [(r.rid, r.output_ids, r.finish_reason) for r in reqs]


@pytest.fixture(scope="module")
def reference():
    """The normal loop (no overlap) on a roomy pool: the tokens every other run must give."""
    return outputs(run(overlap=False, max_running=4)[1])


def test_mixed_workload_exercises_every_path(reference):
    reasons = {r for _, _, r in reference}
    assert {"length", "stop", "abort"} <= reasons
    eng, reqs, _ = run(overlap=True, max_running=4, pool_slots=200, page_size=2)
    assert eng.sched.n_retracted > 0, "the small pool should force retraction"
    assert eng.cache.pages > 0, "the shared system prompt should be cached"
    assert any(r.temperature > 0 for r in reqs)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("pool,page", [(4096, 1), (200, 2)])
def test_overlap_on_equals_off(reference, policy, pool, page):
    eng, reqs, log = run(overlap=True, policy=policy, max_running=4, pool_slots=pool, page_size=page)
    assert outputs(reqs) == reference
    for free, cached, in_use, total in log:  # no slot leaks, after every step
        assert free + cached + in_use == total
    free, cached, in_use, total = eng.sched.accounting()
    assert in_use == 0 and free + cached == total


def test_normal_loop_small_pool_equals_roomy(reference):
    eng, reqs, _ = run(overlap=False, max_running=4, pool_slots=200, page_size=2)
    assert eng.sched.n_retracted > 0
    assert outputs(reqs) == reference


def test_finished_request_extra_step_is_discarded():
    eng, tok = build_engine(EngineConfig(overlap=True))
    r = Request("one", [tok.bos_id] + tok.encode("hello"), max_new_tokens=5)
    eng.run([r])
    assert len(r.output_ids) == 5
    # prefill + 4 decodes make the 5 tokens; the 5th decode was already queued when step 4's
    # result said the request was done, so its row is thrown away
    assert eng.steps == 6 and eng.sched.n_discarded == 1
    eng2, _ = build_engine(EngineConfig(overlap=False))
    r2 = Request("one", [tok.bos_id] + tok.encode("hello"), max_new_tokens=5)
    eng2.run([r2])
    assert eng2.steps == 5 and eng2.sched.n_discarded == 0 and r2.output_ids == r.output_ids


def test_abort_waiting_and_running():
    eng, tok = build_engine(EngineConfig(overlap=True, max_running=1))
    a = Request("a", [tok.bos_id] + tok.encode("first"), max_new_tokens=8)
    b = Request("b", [tok.bos_id] + tok.encode("second"), max_new_tokens=8)
    eng.sched.add(a)
    eng.sched.add(b)
    eng.abort(b)  # still waiting: ends now with no tokens
    assert b.state is State.FINISHED and b.finish_reason == "abort" and b.output_ids == []
    r = Request("c", [tok.bos_id] + tok.encode("third"), max_new_tokens=20, abort_after=2)
    eng2, _ = build_engine(EngineConfig(overlap=True))
    eng2.run([r])
    assert r.finish_reason == "abort" and len(r.output_ids) == 3  # one more step after the client left


def test_stop_string_truncates_and_eos_stops():
    eng, tok = build_engine(EngineConfig())
    from harness.engine.scheduler import Scheduler  # noqa: F401  (the unit under test)
    r = Request("s", [1], max_new_tokens=10, stop=("lo",))
    r.state = State.RUNNING
    eng.sched.running.append(r)
    r.row, r.entry = eng.sched.rows.alloc(), eng.sched.entries.alloc()
    for t in b"hel":
        eng.sched._append(r, t)
    assert r.state is State.RUNNING
    eng.sched._append(r, ord("l"))
    eng.sched._append(r, ord("o"))
    assert r.finish_reason == "stop"
    e = Request("e", [1], max_new_tokens=10)
    e.state = State.RUNNING
    eng.sched.running.append(e)
    e.row, e.entry = eng.sched.rows.alloc(), eng.sched.entries.alloc()
    eng.sched._append(e, tok.eos_id)
    assert e.finish_reason == "stop" and e.output_ids == [tok.eos_id]


def test_too_long_prompt_is_refused():
    eng, tok = build_engine(EngineConfig(pool_slots=64))
    r = Request("big", [1] * 100, max_new_tokens=4)
    with pytest.raises(ValueError, match="does not fit|pool holds"):
        eng.run([r])


def test_seeded_sampling_is_reproducible_and_seed_dependent():
    def go(seed):
        eng, tok = build_engine(EngineConfig(overlap=True))
        rs = [Request(f"t{i}", [tok.bos_id] + tok.encode("abc"), max_new_tokens=12, temperature=1.0,
                      seed=seed + i) for i in range(3)]
        eng.run(rs)
        return [r.output_ids for r in rs]
    assert go(1) == go(1)
    assert go(1) != go(2)
