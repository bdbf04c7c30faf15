"""Speculative steps write only slots the CPU reserved: the CPU keeps each row filled two
windows past its one-step-old count, so even a window that starts a full window ahead of
that count (full acceptance in the step before) ends inside the reservation (Figure 7)."""
import pytest

from races.scenarios import SCENARIOS, seeds

SPEC = sorted(s for s in SCENARIOS if s.startswith("spec_"))


@pytest.mark.parametrize("scenario", SPEC)
def test_windows_inside_reservation(target, tok, oh_options, scenario):
    for seed in seeds(oh_options):
        reqs, kw, did_it = SCENARIOS[scenario](tok, seed)
        run = target.run(reqs, overlap=True, **kw)
        assert did_it(run.engine)
        v = run.engine.sched.violations
        assert not v, f"seed {seed}: {len(v)} window(s) past the reserved slots; first: {v[0]}"
