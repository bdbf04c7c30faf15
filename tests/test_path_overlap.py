"""Overlap per path and in the worker (issue 36, item 4), on event sequences shaped as vLLM's
engine core and worker make them, without vLLM: the fast representative of the served checks in
tests/test_vllm_overlap_paths.py (scheduled tier).

- per request (harness.agents.host_order.HostOrder.on_request): a decode continued in the batch
  scheduled before the wait is overlapped; a chunked prefill whose next chunk the scheduler held
  back (an empty schedule, the engine waits with nothing queued) is early on its own requests while
  the run as a whole still overlaps; a request crowded out of a full batch, preempted, or held by a
  pause is neither;
- per path (harness.oracles.path_overlap): LOST on the path whose share falls, kept elsewhere;
- the worker (host_order.judge_worker): forwards that start only after the previous step's copy.
"""
from harness.agents.host_order import HostOrder, judge, judge_worker
from harness.oracles import path_overlap as po


def _recorder(h: HostOrder) -> dict:
    got: dict = {}
    h.on_request = lambda rid, kind, phase: got.setdefault(rid, []).append(kind if phase == "decode" else kind + ":prefill")
    return got


def _run(h: HostOrder, batches, hold_chunk: bool, room=True, preempt_at=None):
    """The engine core's loop with a batch queue of two: schedule N+1 (if anything), then wait on
    N. `batches`: each step's request ids; "chunk" is a request whose prefill takes the first
    four steps. hold_chunk: the scheduler schedules nothing while a chunk is in flight (the
    patch chunked_prefill_waits_in_flight), so the loop waits with nothing queued."""
    inflight = []
    i = 0
    while i < len(batches) or inflight:
        chunk_in_flight = any(n is not None and n[1] for n in inflight)
        if i < len(batches) and not batches[i]:  # the engine paused: an empty schedule, no step
            h.scheduled([], 0, 0, paused=True)
            i += 1
        elif i < len(batches) and not (hold_chunk and chunk_in_flight):
            ids = batches[i]
            pre = ["d1"] if preempt_at == i else ()
            n = h.scheduled([x for x in ids if x not in pre], 64, 0, room=room, preempted=pre,
                            prefills=["chunk"] if "chunk" in ids and i < 4 else ())
            inflight.append((n, "chunk" in ids and i < 3))
            i += 1
            if len(inflight) < 2:
                continue
        elif i < len(batches):
            h.scheduled([], 0, 0)  # an empty schedule: no step
        n, _ = inflight.pop(0)
        h.wait_start(n)
        h.wait_end(n)


BATCHES = [["chunk", "d1", "d2"]] * 4 + [["d1", "d2", "chunk"]] * 12


def test_a_held_back_chunk_is_early_on_its_prefill_steps_while_the_run_overlaps():
    h = HostOrder()
    got = _recorder(h)
    _run(h, BATCHES, hold_chunk=True)
    assert got["chunk"].count("early:prefill") == 3, got["chunk"]  # each chunk but the last
    # the run: most waits still had a later batch scheduled first
    assert judge(h.counts, tokens=48)[0] is True, (h.counts, judge(h.counts, 48))
    # its prefill steps lost their overlap; its decodes (and the rest of the run) kept theirs
    pre = po.Share(got["chunk"].count("overlapped:prefill"), got["chunk"].count("early:prefill"))
    rest = po.Share(sum(v.count("overlapped") for v in got.values()), 0)
    lost, line = po.judge("chunked_prefill (its prefill steps)", pre, rest.add(pre))
    assert lost is True and "LOST on chunked_prefill (its prefill steps) (1 of 4 waits" in line, line


def test_the_stock_loop_overlaps_every_request():
    h = HostOrder()
    got = _recorder(h)
    _run(h, BATCHES, hold_chunk=False)
    assert all(not k.startswith("early") for v in got.values() for k in v), got
    assert all(v.count("overlapped") >= 10 for v in got.values()), got
    assert got["chunk"].count("overlapped:prefill") == 4, got


def test_crowded_out_preempted_or_paused_is_not_early():
    """A request the batch before the wait had no room for, one preempted, and any while paused:
    the host had nothing to schedule ahead for them."""
    for kw in ({"room": False}, {"preempt_at": 5}, {"pause": True}):
        h = HostOrder()
        got = _recorder(h)
        # one request skipped from step 5: the host waits on step 4 with step 5 (without it) queued
        batches = [["d1", "d2"]] * 5 + [["d2"]] + [["d1", "d2"]] * 5
        if kw.pop("pause", False):
            batches[5] = []  # paused instead: nothing scheduled, then the wait, then resumed
        _run(h, batches, hold_chunk=False, **kw)
        assert "early" not in got.get("d1", []), (kw, got)
    # the same skip with room, no preemption, no pause: held back
    h = HostOrder()
    got = _recorder(h)
    _run(h, [["d1", "d2"]] * 5 + [["d2"]] + [["d1", "d2"]] * 5, hold_chunk=False)
    assert got["d1"].count("early") == 1, got


def test_path_rule_figures_and_threshold():
    rest = po.Share(200, 2)
    lost, line = po.judge("chunked_prefill", po.Share(10, 12), rest.add(po.Share(10, 12)))
    assert lost is True and line.startswith("overlap: LOST on chunked_prefill (10 of 22 waits overlapped"), line
    assert "the rest of the run: 200 of 202" in line
    assert po.judge("x", po.Share(40, 2), rest.add(po.Share(40, 2)))[0] is False
    assert po.judge("x", po.Share(1, 2), rest)[0] is None  # too few waits on the path
    # a whole run that is lost is the run-level oracle's, not one path's
    assert po.judge("x", po.Share(5, 15), po.Share(50, 150))[0] is False


def test_books_sum_by_request_key():
    from harness.agents.vllm.steps import FIELDS, request_key
    from harness.engine.request import Request
    r = Request(rid="a", prompt_ids=[1, 2, 3], max_new_tokens=5)
    rec = [0] * len(FIELDS)
    rec[FIELDS.index("key")] = request_key([1, 2, 3], 5)
    rec[FIELDS.index("overlapped")], rec[FIELDS.index("early")] = 7, 2
    rec[FIELDS.index("overlapped_prefill")], rec[FIELDS.index("early_prefill")] = 1, 2
    keys = po.by_key({"cmpl-1": rec, "cmpl-2": list(rec)})
    assert po.share_of([r], keys) == po.Share(14, 4)
    assert po.share_of([r], po.by_key({"cmpl-1": rec}, "prefill")) == po.Share(1, 2)
    assert po.by_key({"old": rec[:10]}) == {}  # an older agent's books: no per-request overlap
    lost, line, _ = po.judge_row("p", {"cmpl-1": rec}, [r], [r])  # the path is the whole run: not its to judge
    assert lost is not True, line


def test_worker_forwards_after_the_copy_are_lost():
    assert judge_worker({"judged": 20, "after_copy": 20}, None)[0] is False
    assert judge_worker({"judged": 30, "after_copy": 22}, {"judged": 10, "after_copy": 2})[0] is False
    ok, why = judge_worker({"judged": 20, "after_copy": 1}, None)
    assert ok is True and "1 of 20 forwards" in why and "waited for that copy" in why, why
    assert judge_worker({"judged": 2, "after_copy": 2}, None)[0] is None
    assert judge_worker({"judged": 5, "after_copy": 5}, {"judged": 50, "after_copy": 0})[0] is False  # restarted


def test_stress_sums_each_feature_over_the_run_and_says_lost():
    """stress: each drawn feature's share over the run (harness.search.served.explore.overlap_lines)."""
    from types import SimpleNamespace
    from harness.search.served.explore import overlap_lines
    r = SimpleNamespace(feature_overlap={"chunked_prefill": {"all": po.Share(30, 2), "prefill": po.Share(4, 10)},
                                         "penalties": {"all": po.Share(40, 0), "prefill": po.Share(5, 0)}},
                        overlap_total={"all": po.Share(300, 2), "prefill": po.Share(60, 10)})
    lines = overlap_lines(r)
    assert lines[0].startswith("overlap per feature") and "chunked_prefill 30/32 (prefill 4/14)" in lines[0]
    assert lines[1].startswith("overlap: LOST on chunked_prefill (its prefill steps) (4 of 14"), lines
    r.feature_overlap["chunked_prefill"]["prefill"] = po.Share(14, 0)
    r.overlap_total["prefill"] = po.Share(70, 0)
    assert len(overlap_lines(r)) == 1  # stock: every feature kept
