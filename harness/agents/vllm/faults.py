"""Where the agent's seeded delays and the vLLM fault catalogue (harness.agents.vllm.points:
DELAY_POINTS, CATALOGUE) act. Each is taken inside the wrapper of the point it names, so its
timing relative to vLLM's own code is that point's:

| delay / fault | point | taken in |
|---|---|---|
| delay engine_step; faults spin_no_progress, wait_before_schedule | engine_step (+ engine_step_sync for the spin) | timing.engine_step |
| delay worker_execute | worker_execute | timing.worker_execute |
| delay output_copy (inside the copy thread); fault pinned_buffer_reuse | output_copy | copy_engine.CopyEngine |
| delay before_wait; fault sampled_ids_no_wait | before_wait | copy_engine.before_wait |
| fault penalty_stale_output_ids | penalty_ids | penalty_ids, below |

The plan decides each (harness.agents.plan: Plan.delay, Plan.fault); without one nothing acts.
"""
from __future__ import annotations

from harness.agents.vllm import counters, state


def spin():
    """Fault spin_no_progress: the engine core steps and never delivers (a livelock such as
    outputs taken newest-first): vLLM's loop calls the step again after 1 ms, for ever."""
    f = state.facts("engine")
    f.add("steps")
    f.write()
    return None, False


def penalty_ids(orig):
    def update_async_output_token_ids(self):
        if state.PLAN.fault("penalty_stale_output_ids"):
            return
        out = orig(self)
        counters.custom_lp_facts(self)
        return out
    return update_async_output_token_ids
