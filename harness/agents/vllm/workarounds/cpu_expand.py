"""The rejection sampler's per-token sampling parameters, on vLLM's CPU build (vllm#55005).

With drafts, RejectionSampler expands each request's temperature, top_k and top_p to its draft
tokens (rejection_sampler.expand_batch_to_tokens: a buffer from `x.new_empty(num_tokens)`, filled
by expand_kernel). vLLM's CPU build routes that kernel to a C++ op through
vllm/utils/cpu_triton_utils._expand_kernel_impl, which hands the op `_ensure_int64(output)`: for
the float32 temperature and top_p and the int32 top_k that is a new tensor, so the caller's buffer
is never written (and the float values would be truncated besides). Every step with drafts and a
non-greedy request then divides the draft positions' logits by uninitialized memory: negative or
huge "temperatures" turn the target's argmax into its argmin, and greedy requests of the same
batch (temperature 0, meant to become 1) decode runs of token 0 or glitch tokens. Both arms alike;
which requests share a batch differs between them, so their tokens differ too.

The agent expands at the caller's dtype, as the Triton kernel does (the replace of
`replace_from` by `replace_to` before the store) and as the fix proposed upstream does
(vllm#55006, open), and counts the expansions it wrote (`cpu_expand_fixes`). Turned on where the
release table's fact cpu_expand_drops_output holds (0.20.0, where the shim came, up to 0.34.0,
where the V1 runner is gone); "cpu_expand_dtype" under the plan's "stock" runs vLLM's own shim.
"""
from __future__ import annotations

from harness.agents.vllm import state

FACT = "cpu_expand_drops_output"  # harness.targets.vllm.releases FACTS: the releases it holds in
POINT = "cpu_expand"


def patch(orig):
    """The shim, writing into the caller's buffer at its own dtype (vLLM's dispatcher passes the
    kernel's arguments positionally: the signature keeps the shim's names and order)."""
    def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
        import torch
        if output.dtype == torch.int64 and input_val.dtype == torch.int64:
            return orig(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS)
        state.facts("worker").add("cpu_expand_fixes")
        if "cpu_expand_dtype" in state.PLAN.data.get("stock", ()):
            return orig(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS)
        expand_into(output, input_val, cu_num_tokens, replace_from, replace_to)
    return _expand_kernel_impl


def expand_into(output, input_val, cu_num_tokens, replace_from, replace_to) -> None:
    """output[cu[i-1]:cu[i]] = input_val[i] (replace_from read as replace_to), at output's dtype."""
    import torch
    vals = input_val.masked_fill(input_val == replace_from, replace_to)
    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    n = int(cu[-1]) if cu.numel() else 0
    output[:n] = torch.repeat_interleave(vals, counts).to(output.dtype)


PATCHES = {POINT: patch}
