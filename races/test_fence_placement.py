"""Every read of the shared tables (req_to_token, the relay) by step N happens before the event
that the schedule stream waits on after launching step N (article section 7.4)."""
import pytest

from races.scenarios import SCENARIOS, seeds

SHARED = ("req_to_token", "relay.")


def fence_events(dev):
    """step -> the record op (of the forward stream) the schedule stream waited on after that step's launch."""
    recs = {op.id: op for op in dev.ops}
    out = {}
    for op in dev.ops:
        if op.stream == "schedule" and op.kind == "wait" and op.meta.get("event") is not None:
            ev = recs[op.meta["event"]]
            if ev.stream == "forward" and op.step not in out:
                out[op.step] = ev
    return out


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_table_reads_before_fence_event(target, tok, oh_options, scenario, record_property):
    for seed in seeds(oh_options):
        reqs, kw, _ = SCENARIOS[scenario](tok, seed)
        run = target.run(reqs, overlap=True, track=SHARED, **kw)
        dev = run.engine.dev
        fences = fence_events(dev)
        reads = [a for a in run.tracker.log if not a.write and a.thread == "forward"]
        assert reads, "no table read was seen: the tracker is not attached"
        for a in reads:
            ev = fences.get(a.step)
            if ev is None:
                record_property("first_step", a.step)
                pytest.fail(f"step {a.step}: the schedule stream never waits for this step's table reads "
                            f"({a.name} reads {a.buffer})")
            if a.clock.get("forward") > ev.clock.get("forward"):
                record_property("first_step", a.step)
                pytest.fail(f"step {a.step}: {a.name} reads {a.buffer} after the fence event "
                            f"{ev.name} ({ev.site}): the scheduler's writes are not held behind this read")
