"""The CPU attention's batch split by prompt length, which sends a resumed request's multi-token
chunk to the decode kernel (KNOWN_UPSTREAM cpu-resume-as-decode).

Turned on where the release table's fact cpu_reorder_by_prompt holds (every release up to
0.11.1); "cpu_resume_as_decode" under the plan's "stock" leaves vLLM's split (reproducer:
fixtures/vllm_upstream/cpu_resume_as_decode.json).
"""
from __future__ import annotations

from harness.agents.vllm import state

FACT = "cpu_reorder_by_prompt"  # harness.targets.vllm.releases FACTS: the releases it holds in
POINT = "cpu_reorder"


def patch(orig):
    """FACT cpu_reorder_by_prompt (KNOWN_UPSTREAM cpu-resume-as-decode, vLLM before 0.11.1): the CPU
    attention's reorder_batch puts a request in the decode part of the batch once its prompt is
    computed, whatever it is scheduled for, so a request resumed after preemption whose cached
    blocks cover part of its output is a decode with a multi-token chunk, and IPEX's decode kernel
    reads past the decode rows' block table (SIGSEGV). After vLLM's reorder, each decode row
    scheduled with more than one token is moved into the prefill part (a swap with the first decode
    row, the builder's prefill count one up): the classification by scheduled tokens that 0.11.1
    has. Each such row is counted; with "cpu_resume_as_decode" under "stock" it is left in place."""
    def reorder_batch(self, input_batch, scheduler_output, *a, **kw):
        changed = orig(self, input_batch, scheduler_output, *a, **kw)
        first = self.num_prompt_req  # rows [0, first) are vLLM's prefills, the rest its decodes
        stock = "cpu_resume_as_decode" in state.PLAN.data.get("stock", ())
        for row in range(first, input_batch.num_reqs):
            if scheduler_output.num_scheduled_tokens.get(input_batch.req_ids[row], 0) <= 1:
                continue
            state.facts("worker").add("cpu_resume_reorders")
            if stock:
                continue
            if row != first:  # the row at `first` is a decode already looked at (one token)
                input_batch.swap_states(first, row)
            first += 1
            changed = True
        self.num_prompt_req = first
        return changed
    return reorder_batch


PATCHES = {POINT: patch}
