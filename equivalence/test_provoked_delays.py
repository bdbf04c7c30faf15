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

from harness.verdict import outcome

from harness.workloads import presets as workloads
from harness.oracles.divergence import record_problems, report, run_logprobs
from harness.oracles.reference import divergences, not_exercised, without

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


def plans_of(target) -> list[dict]:
    """The target's own points (SGLang's agent holds back other points than vLLM's): a plan whose
    points the agent does not have would hold back nothing, and pass without provoking anything."""
    own = getattr(target, "provoke_plans", None)
    return own() if own is not None else PLANS


@pytest.mark.parametrize("plan", range(len(PLANS)), ids=lambda i: f"plan{i}")
def test_delays_keep_tokens(target, tok, oh_options, plan, record_property):
    if not hasattr(target, "set_plan"):
        pytest.skip(f"{target.name} has no agent to hold back its async path; races/test_provoked_corruption "
                    "attacks the ref engine's streams")
    plans = plans_of(target)
    if plan >= len(plans):
        pytest.skip(f"{target.name} has {len(plans)} delay plans")
    delays = plans[plan]
    record_property("delays", str(delays))
    for seed in range(oh_options.seeds or 1):
        reqs = _workload(tok, seed)
        skip = not_exercised(target, reqs, record_property, f"of seed {seed}")
        off = target.run(reqs, overlap=False)
        on = target.run(reqs, overlap=True, delays=delays, seed=seed)
        stale = record_problems(on.outputs, run_logprobs(on))
        assert not stale, f"delays {delays}: a logprob record is not its token's (a host-buffer race): {stale[0]}"
        held = _held(on)
        if held is not None and held <= 0:
            outcome.not_exercised(f"not exercised: delays {delays}: the agent held back nothing in this run",
                                  "delays.none_held")
        found = without(divergences(off, on), skip)
        bad = [d for _, _, divs in found for d in divs if not d.near_tie]
        assert not bad, (f"delays {delays} (seed {seed}): request {bad[0].rid} diverges from the overlap-off "
                         f"run at token {bad[0].position} ({bad[0].verdict})\n"
                         f"{report(bad, getattr(tok, 'decode', None))}")


def _held(run) -> int | None:
    """How many delays the agent applied during the run (SGLang's counters; None where the
    target's agent does not count them here)."""
    facts, before = run.summary.get("facts"), run.summary.get("facts_before") or []
    if not facts:
        return None
    keys = ("forward_delays", "copy_delays")
    now = sum(f.get(k, 0) for f in facts for k in keys if f.get("role") == "sglang-scheduler")
    was = sum(f.get(k, 0) for f in before for k in keys if f.get("role") == "sglang-scheduler")
    if not any(f.get("role") == "sglang-scheduler" for f in facts):
        return None
    return now - was
