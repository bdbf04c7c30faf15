"""Slot ownership on the device side: every KV and draft-KV slot a step writes belongs to the
writing row's pages as reserved when the step was planned, and every slot it reads belongs to
one of its rows (or is the padding slot). Judged from the slots the device actually touched
(the access tracker's log), not from the CPU's idea of the window, so a speculative write past
the reservation or pages freed before a dispatched step ran are caught even when the tokens
come out the same (harness/hazards/ownership.py)."""
import pytest

from harness.hazards.ownership import KV_PREFIXES, check
from races.scenarios import SCENARIOS, seeds


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_steps_touch_only_their_rows_slots(target, tok, oh_options, scenario, record_property):
    for seed in seeds(oh_options):
        reqs, kw, did_it = SCENARIOS[scenario](tok, seed)
        run = target.run(reqs, overlap=True, track=KV_PREFIXES, **kw)
        assert did_it(run.engine), f"workload {scenario} (seed {seed}) did not exercise what it is for"
        writes = [a for a in run.tracker.log if a.write and a.meta.get("plan")]
        assert writes, "no KV write with its step's plan was seen: the tracker or the plan is not attached"
        bad = check(run.tracker.log)
        if bad:
            record_property("first_step", bad[0].step)
        assert not bad, f"seed {seed}: {len(bad)} ownership violation(s); first: {bad[0]}"
