"""The served overlap oracle's rule (harness.agents.host_order), on event sequences shaped as
vLLM's engine core makes them: async scheduling (schedule N+1, then wait on N), the same loop
waiting before it schedules (the queue still holds two batches), start-up and tail, and a loop
that delivers nothing; and the hang watchdog's bound."""
from harness.agents.host_order import EARLY_FRACTION, MIN_JUDGED, HostOrder, delta, judge
from harness.targets.served.pair import HANG_CAP_S, HANG_FLOOR_S, HANG_STEPS, hang_bound, progress_of

REQS = ["a", "b", "c"]


def _async_loop(h: HostOrder, steps: int, wait_first: bool, reqs=REQS) -> None:
    """`steps` decode steps of the same requests through a batch queue of two; wait_first: the
    host waits on the batch in flight before scheduling the next (the fault)."""
    inflight = [h.scheduled(reqs, 3, 0)]  # start-up: one batch, nothing to overlap with yet
    for _ in range(steps):
        if wait_first:
            h.wait_start(inflight[0])
            h.wait_end(inflight[0])
        inflight.append(h.scheduled(reqs, 3, 0))
        n = inflight.pop(0)
        h.wait_start(n)  # the loop's own wait: a second wait on the same batch is no new event
        h.wait_end(n)
    h.wait_start(inflight[0])  # the tail: the last batch, nothing scheduled after it
    h.wait_end(inflight[0])


def test_async_loop_is_effective():
    h = HostOrder()
    _async_loop(h, 20, wait_first=False)
    assert h.counts["overlapped"] == 20 and h.counts["early"] == 0, h.counts
    effective, why = judge(h.counts, tokens=60)
    assert effective is True, why


def test_waiting_before_scheduling_is_lost():
    h = HostOrder()
    _async_loop(h, 20, wait_first=True)
    assert h.counts["early"] == 20 and h.counts["overlapped"] == 0, h.counts
    effective, why = judge(h.counts, tokens=60)
    assert effective is False and "20 of 20" in why, why


def test_one_batch_at_a_time_is_not_counted():
    """A burst of new requests after each wait (no request continues): one batch only, never
    early; too few judged waits is `not judged`, not effective."""
    h = HostOrder()
    for i in range(10):
        n = h.scheduled([f"r{i}"], 5, 0)
        h.wait_start(n)
        h.wait_end(n)
    assert h.counts["single"] >= 9 and h.counts["early"] == 0, h.counts
    assert judge(h.counts, tokens=10)[0] is None


def test_threshold_and_no_tokens():
    judged = 4 * MIN_JUDGED
    early = int(EARLY_FRACTION * judged)
    assert judge({"overlapped": judged - early, "early": early}, 10)[0] is True  # at the threshold
    assert judge({"overlapped": judged - early - 1, "early": early + 1}, 10)[0] is False
    assert judge({"overlapped": 100, "early": 0}, tokens=0)[0] is None  # nothing delivered: never effective


def test_ring_is_bounded_and_delta_is_per_run():
    h = HostOrder(ring=64)
    _async_loop(h, 500, wait_first=False)
    assert len(h.events) == 64 and len(h.facts()["last_events"]) <= 24
    before = h.facts()
    _async_loop(h, 10, wait_first=True, reqs=["d", "e"])  # other requests (the tail above: one batch)
    d = delta(h.facts(), before)
    assert d["early"] == 10 and d["overlapped"] == 0, d
    assert delta({"early": 1}, {"early": 5})["early"] == 1  # a restarted engine: its own counts


def test_hang_bound():
    assert hang_bound(None) == HANG_CAP_S
    assert hang_bound(0.01) == HANG_FLOOR_S
    assert hang_bound(0.5) == HANG_STEPS * 0.5
    assert hang_bound(10.0) == HANG_CAP_S
    facts = [{"role": "engine", "tokens_out": 7, "token_period_ms": 40.0, "steps": 9}, {"role": "api"}]
    assert progress_of(facts) == (7, 0.04, 9)
    assert progress_of([{"role": "api"}])[0] is None  # no counter: no watchdog


def test_schedules_during_forwards():
    from harness.agents.host_order import schedules_during_forwards
    fw = [(100, 200), (210, 300)]
    events = [("schedule", 0, 50, 3), ("schedule", 1, 150, 3), ("wait", 0, 160, 0), ("schedule", 2, 205, 3),
              ("schedule_empty", -1, 250, 0), ("schedule", 3, 250, 3)]
    assert schedules_during_forwards(events, fw) == (2, 3)  # 50: before the span; 205: the worker idled
    assert schedules_during_forwards(events, []) == (0, 0)
