"""The hazard does real harm: under schedules that hold a stream back (delay) or reorder the
streams (pct, random), the correct engine's tokens always equal the serial no-overlap run's;
with the fence removed, some schedule makes them differ. The hazard tracker also runs under
these schedules (one per seed, in turn), so what a step touches under other interleavings is
checked too, not only under the serial policy of test_war_slot_table."""
import pytest

from harness.oracles.divergence import compare_runs
from harness.oracles.reference import ABSOLUTE, absolute_reference, batch_invariant
from races.scenarios import SCENARIOS, seeds


def policies(seed: int) -> list[str]:
    return [f"delay:forward:{1 + 4 * (seed % 2)}", f"delay:copy:{2 + seed % 3}", f"random:{seed}",
            f"pct:{seed}:3", f"pct:{seed + 100}:2"]


def first_divergence(expected, got, exact: bool = True):
    """Where `got` (a Run) first differs from `expected`; on a target that is not batch-invariant,
    only a divergence at a clear winner counts (a numerical tie is rounding)."""
    if not exact:
        divs = [d for d in compare_runs(expected, got) if not d.near_tie]
        return f"{divs[0].rid} at token {divs[0].position} ({divs[0].verdict})" if divs else None
    expected, got = expected.outputs, got.outputs
    for e, g in zip(expected, got):
        if e != g:
            k = next((i for i, (a, b) in enumerate(zip(e[1], g[1])) if a != b), min(len(e[1]), len(g[1])))
            return f"{e[0]} at token {k}"
    return None


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_schedules_keep_tokens(target, tok, oh_options, scenario):
    for seed in seeds(oh_options):
        reqs, kw, _ = SCENARIOS[scenario](tok, seed)
        exact = batch_invariant(target)
        expected = target.run(reqs, overlap=False, policy="serial", **kw)
        ref = absolute_reference(target, reqs, **kw)  # each request alone: sees a bug both runs share
        where = first_divergence(ref, expected) if ref is not None else None
        assert where is None, f"the serial overlap-off run diverges from {ABSOLUTE} (workload seed {seed}): first {where}"
        for i, policy in enumerate(policies(seed)):
            # the hazard tracker rides along on one schedule per seed (delay, random, pct, ... in
            # turn: five seeds cover every kind; it costs 2-3 untracked runs): an index slip that
            # makes a step touch another buffer only under some interleaving shows as a hazard
            # there, even if the tokens survive
            track = i == (2 * seed) % 5
            run = target.run(reqs, overlap=True, policy=policy, track=track, **kw)
            where = first_divergence(expected, run, exact)
            assert where is None, f"tokens diverged under {policy} (workload seed {seed}): first {where}"
            assert not run.hazards, (f"{len(run.hazards)} hazard(s) under {policy} (workload seed {seed}); "
                                     f"first: {run.hazards[0]}")
