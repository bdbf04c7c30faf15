"""No unordered conflicting access on the slot table, the relay, the KV pool, or any other
named buffer (step inputs, step outputs, the pinned host buffers), decided by happens-before
from program order: one serial run per workload is enough, and a missing fence is reported at
the first step where it matters even though under the serial policy nothing goes wrong."""
import pytest

from races.conftest import first_hazard_line
from races.scenarios import SCENARIOS, seeds


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_no_hazard(target, tok, oh_options, scenario, record_property):
    for seed in seeds(oh_options):
        reqs, kw, did_it = SCENARIOS[scenario](tok, seed)
        run = target.run(reqs, overlap=True, policy="serial", track=True, **kw)
        assert did_it(run.engine), f"workload {scenario} (seed {seed}) did not exercise what it is for"
        if run.hazards:
            record_property("first_step", run.hazards[0].step)
        assert not run.hazards, f"seed {seed}: " + first_hazard_line(run)
