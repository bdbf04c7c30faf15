"""Nothing leaks (issue 23): every resource the engine allocates (KV pages with the prefix
cache's references, slot-table rows, relay entries, host ring slots, reserved windows,
scheduler entries) is accounted for after every step and is back at idle, overlap on and
off, on the paths where a leak lives: a prefix page cached first by another request (the
dedup path), an abort with a step in flight, a retraction, rows reused, speculative windows.
A finding names the resource, the step and the request holding what was not returned; a
leak that starves admission ends the run as HANG with the same books."""
import pytest

from harness.engine.loop import EngineHang
from harness.oracles.conservation import findings
from harness.workloads import presets as workloads
from races.scenarios import SCENARIOS, seeds


def aborts(tok, seed=0):
    """Aborts while running (the client saw enough; one more step is in flight), a shared
    prefix cached and reused, and a pool small enough to retract (at seed 0, the kill
    matrix's, twice; some other seeds' workloads fit without: only the abort is required)."""
    return workloads.mixed(tok, 10, seed), dict(max_running=4, pool_slots=200, page_size=2), \
        lambda e: any(r.finish_reason == "abort" and r.output_ids for r in e.sched.finished)


# retraction is in `aborts` (a 200-slot pool); NGRAM waits for every step by design and
# reserves as the oracle drafter does, so its runs would only add time to the gate
CASES = {**{k: v for k, v in SCENARIOS.items() if k not in ("retraction", "spec_ngram")}, "aborts": aborts}


@pytest.mark.parametrize("scenario", sorted(CASES))
def test_every_resource_returned(target, tok, oh_options, scenario, record_property):
    for seed in seeds(oh_options, 1):
        reqs, kw, exercised = CASES[scenario](tok, seed)
        for overlap in (True, False):
            arm = f"seed {seed}, overlap {'on' if overlap else 'off'}"
            try:
                eng = target.run(reqs, overlap=overlap, **kw).engine
            except EngineHang as e:  # the leak starved admission: its finding says where it began
                bad = e.engine.books.findings
                if bad:
                    record_property("first_step", bad[0].step)
                assert not bad, f"{arm}: {bad[0]}; then {e}"
                raise
            bad = findings(eng)
            if bad:
                record_property("first_step", bad[0].step)
            assert not bad, f"{arm}: {bad[0]}"
            # the scenario's path is an overlap path (an extra step in flight); overlap off is the control
            assert exercised(eng) or not overlap, f"{arm}: not exercised: the {scenario} path never ran"
