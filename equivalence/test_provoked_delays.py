"""Provoked corruption on a real engine: the agent inside the engine's processes holds back one
point of the async path at a time (the engine step that schedules N+1, the worker's step, the
copy of the sampled ids, the output thread before its wait), by seeded plan, and the tokens
must still equal the run with overlap off. A correct engine waits where it must, so a delay
only costs time; one that skips a wait or reuses a buffer too early shows it here.

The ref engine's streams are attacked by races/test_provoked_corruption.py (schedule
policies on the simulated device); this suite needs an agent, so it runs against served
targets only.
"""
import pytest

from harness.workloads import presets as workloads
from harness.oracles.divergence import record_problems, report, run_logprobs
from harness.oracles.reference import divergences

# Each plan holds back some points of the async path. "steps" are the worker's forward time as
# the agent measures it, so a reader held back two steps lets the host run a full step ahead of
# it on any machine; "ms" are fixed.
PLANS = [
    {"before_wait": {"p": 1.0, "steps": 2}},
    {"output_copy": {"p": 0.5, "steps": 1.5}, "engine_step": {"p": 0.3, "ms": 10}},
    {"worker_execute": {"p": 0.5, "ms": 20}, "before_wait": {"p": 0.5, "steps": 1.5}},
]


def _workload(tok, seed):
    reqs = workloads.mixed(tok, 8, seed=seed)
    for r in reqs:
        r.max_new_tokens = max(r.max_new_tokens, 12)
    return reqs


@pytest.mark.parametrize("plan", range(len(PLANS)), ids=[",".join(p) for p in PLANS])
def test_delays_keep_tokens(target, tok, oh_options, plan):
    if not hasattr(target, "set_plan"):
        pytest.skip(f"{target.name} has no agent to hold back its async path; races/test_provoked_corruption "
                    "attacks the ref engine's streams")
    for seed in range(oh_options.seeds or 1):
        reqs = _workload(tok, seed)
        off = target.run(reqs, overlap=False)
        on = target.run(reqs, overlap=True, delays=PLANS[plan], seed=seed)
        stale = record_problems(on.outputs, run_logprobs(on))
        assert not stale, f"delays {PLANS[plan]}: a logprob record is not its token's (a host-buffer race): {stale[0]}"
        found = divergences(off, on)
        bad = [d for _, _, divs in found for d in divs if not d.near_tie]
        assert not bad, (f"delays {PLANS[plan]} (seed {seed}): request {bad[0].rid} diverges from the overlap-off "
                         f"run at token {bad[0].position} ({bad[0].verdict})\n"
                         f"{report(bad, getattr(tok, 'decode', None))}")
