"""A later pipeline stage's receive buffer on V1, under --enforce-eager on vLLM's CPU build
(KNOWN_UPSTREAM cpu-v1-pp-eager-no-intermediate; found 2026-12-07 with the pp2-v1 configuration,
issue 45; no upstream report found).

With pipeline parallelism every stage after the first copies the previous stage's hidden states
into a buffer of its own (GPUModelRunner.intermediate_tensors) before its forward
(sync_and_gather_intermediate_tensors, which asserts the buffer is there). V1's runner allocates
it only in _dummy_run, which a GPU reaches through its warm-up (graph capture, profiling); vLLM's
CPU worker warms up only through CPUModelRunner.warming_up_model, which returns at once when the
compilation mode is NONE (--enforce-eager). So stage 1 asserts on its first step, returns no
output, and the engine core dies with a KeyError in Scheduler.update_from_output, async on and
off.

The agent allocates the buffer at the first step that needs it, as _dummy_run does (the model's
make_empty_intermediate_tensors, max_num_tokens rows, the model's dtype, the runner's device),
and counts it (`cpu_v1_pp_no_intermediate`: once a stage). Turned on where the release table's
fact cpu_v1_pp_eager_no_intermediate holds (0.27.0, where the warm-up returns early, up to 0.34.0,
where the V1 runner is gone; read from each cached wheel); "cpu_v1_pp_buffer" under the plan's
"stock" runs vLLM's own code (reproducers: fixtures/vllm_upstream/cpu_v1_pp_eager_no_intermediate.py,
offline without the agent, and .json, served).
"""
from __future__ import annotations

from harness.agents.vllm import state

FACT = "cpu_v1_pp_eager_no_intermediate"  # harness.targets.vllm.releases FACTS: the releases it holds in
POINT = "pp_receive_buffer"


def patch(orig):
    """sync_and_gather_intermediate_tensors(num_tokens, intermediate_tensors, sync_self): only a
    stage after the first calls it, and its buffer is missing only where no warm-up ran."""
    def sync_and_gather_intermediate_tensors(self, *a, **kw):
        if getattr(self, "intermediate_tensors", False) is None:
            state.facts("worker").add("cpu_v1_pp_no_intermediate")
            if "cpu_v1_pp_buffer" not in state.PLAN.data.get("stock", ()):
                self.intermediate_tensors = self.model.make_empty_intermediate_tensors(
                    batch_size=self.max_num_tokens, dtype=self.model_config.dtype, device=self.device)
        return orig(self, *a, **kw)
    return sync_and_gather_intermediate_tensors


PATCHES = {POINT: patch}
