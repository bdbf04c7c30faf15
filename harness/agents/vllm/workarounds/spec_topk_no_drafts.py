"""A step without drafts on a drafter's configuration, on vLLM's CPU build (KNOWN_UPSTREAM
cpu-spec-topk-no-drafts; found by `stress --target vllm --configs spec`, no upstream report found).

With a speculative config the V1 runner builds a SpecDecodeMetadata for every step, also one in
which no request has a draft (a prefill alone, requests near max_tokens), and samples it through
the rejection sampler with no draft position to verify. Its apply_sampling_constraints then expands
top_k to those zero positions and, when no request of the batch has top_p, hands the empty tensor
to apply_top_k_only, which vLLM's CPU build takes (Triton has no CPU backend) and whose
`k.max()` raises on it ("max(): Expected reduction dim to be specified for input.numel() == 0"):
the worker dies, async on and off, whenever a top_k request meets such a step.

The agent returns the (empty) logits as they are when there is no draft position, which is what
the constraint would give, and counts it (`cpu_spec_topk_no_drafts`). Turned on where the release
table's fact cpu_spec_topk_no_drafts holds (0.11.1, where the function came, up to 0.34.0, where
the V1 runner is gone; read from each cached wheel); "cpu_spec_topk" under the plan's "stock" runs vLLM's own code
(reproducers: fixtures/vllm_upstream/cpu_spec_topk_no_drafts.py, without a server, and .json).
"""
from __future__ import annotations

from harness.agents.vllm import state

FACT = "cpu_spec_topk_no_drafts"  # harness.targets.vllm.releases FACTS: the releases it holds in
POINT = "spec_constraints"


def patch(orig):
    """apply_sampling_constraints(logits, cu_num_draft_tokens, sampling_metadata): nothing to
    constrain at zero draft positions; counted only where vLLM's own code would reach the top-k op
    (a non-greedy batch with top_k and without top_p), which is where it raises."""
    def apply_sampling_constraints(logits, cu_num_draft_tokens, sampling_metadata, *a, **kw):
        if (logits.shape[0] == 0 and not sampling_metadata.all_greedy and sampling_metadata.top_k is not None
                and sampling_metadata.top_p is None):
            state.facts("worker").add("cpu_spec_topk_no_drafts")
            if "cpu_spec_topk" not in state.PLAN.data.get("stock", ()):
                return logits
        return orig(logits, cu_num_draft_tokens, sampling_metadata, *a, **kw)
    return apply_sampling_constraints


PATCHES = {POINT: patch}
