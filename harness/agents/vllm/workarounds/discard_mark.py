"""The discard mark of a running request with no step in flight (vllm#42043), an async-scheduling
bug of vLLM's scheduler on every platform.

Turned on where the release table's fact discard_without_step_in_flight holds (0.12.0 up to
0.22.0, where vllm#42117 fixed it); "discard_without_step" under the plan's "stock" keeps vLLM's
mark (reproducer: fixtures/vllm_upstream/async_discard_without_step.json).
"""
from __future__ import annotations

from harness.agents.vllm import state

FACT = "discard_without_step_in_flight"  # harness.targets.vllm.releases FACTS: the releases it holds in
POINT = "reset_cache"


def patch(orig):
    """FACT discard_without_step_in_flight (vllm#42043): reset_prefix_cache(reset_running_requests=
    True) marks every running request to discard its next sampled token. One with no sampling step
    in flight (no output placeholder: every running request once /pause?mode=keep has drained the
    engine, or one left out of the last step) then loses its next real token, keeps a placeholder
    that never drains and, one token short of max_tokens, is passed over for ever by the guard for a
    request whose last token is in flight: a livelock. The mark is kept only where a step is in
    flight (what vllm#42117 does from 0.22.0), unless the plan lists "discard_without_step" under
    "stock"; each request vLLM marked without a step in flight is counted (async only: the
    synchronous scheduler never reads the mark), apart for a reset made by a pause."""
    def reset_prefix_cache(self, reset_running_requests=False, *a, **kw):
        idle = [r for r in self.running if not r.num_output_placeholders] if reset_running_requests else []
        paused = getattr(getattr(self, "pause_state", None), "name", "UNPAUSED") != "UNPAUSED"
        out = orig(self, reset_running_requests, *a, **kw)
        marked = [r for r in idle if getattr(r, "discard_latest_async_tokens", False)]
        if marked and self.scheduler_config.async_scheduling:
            state.facts("engine").add("pause_discards_without_step" if paused else "reset_discards_without_step",
                                 len(marked))
            if "discard_without_step" not in state.PLAN.data.get("stock", ()):
                for r in marked:
                    r.discard_latest_async_tokens = False
        return out
    return reset_prefix_cache


PATCHES = {POINT: patch}
