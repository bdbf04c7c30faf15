"""Overlap on and off give the same tokens, request for request (greedy, seeded sampling,
repetition penalty, stop strings, aborts, retraction)."""
import pytest

from harness import workloads


def _penalized(tok, seed):
    reqs = workloads.mixed(tok, 8, seed=seed)
    for i, r in enumerate(reqs):
        if i % 2 == 0:
            r.repetition_penalty = 1.3
    return reqs


PRESETS = {
    "mixed": (lambda tok, s: workloads.mixed(tok, 10, seed=s), dict(max_running=4)),
    "pressure": (lambda tok, s: workloads.pressure(tok, seed=s), dict(max_running=4, pool_slots=120, page_size=2)),
    "penalty": (_penalized, dict(max_running=4)),
}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_overlap_on_equals_off(target, tok, oh_options, preset):
    make, kw = PRESETS[preset]
    for seed in range(oh_options.seeds or 2):
        reqs = make(tok, seed)
        off = target.run(reqs, overlap=False, **kw).outputs
        on = target.run(reqs, overlap=True, **kw).outputs
        bad = [(a[0], next((i for i, (x, y) in enumerate(zip(a[1], b[1])) if x != y), None))
               for a, b in zip(off, on) if a != b]
        assert not bad, f"seed {seed}: {len(bad)} request(s) differ with overlap on; first {bad[0][0]} at token {bad[0][1]}"
