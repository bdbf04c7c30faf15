"""Unpinned grammar row indices on CPU (vllm#37705).

Turned on where the release table's fact grammar_indices_pinned holds (0.11.1 up to 0.19.0);
"cpu_grammar_pin" under the plan's "stock" leaves vLLM's own call (reproducer:
fixtures/vllm_upstream/cpu_grammar_pinned_indices.json).
"""
from __future__ import annotations

from harness.agents.vllm import state

FACT = "grammar_indices_pinned"  # harness.targets.vllm.releases FACTS: the releases it holds in
POINT = "grammar"


class _UnpinnedTorch:
    """vllm.v1.structured_output.utils' `torch` while apply_grammar_bitmask runs on CPU logits:
    `torch.tensor(..., pin_memory=True)` (a CUDA-only request: "Found no NVIDIA driver" / "requires
    a CUDA or other accelerator backend") becomes the plain list xgrammar's CPU kernel takes."""

    def __init__(self, torch):
        self._torch = torch

    def tensor(self, data, *a, pin_memory=False, **kw):
        if pin_memory:
            state.facts("worker").add("cpu_grammar_pinned_indices")
            return _IndexList(data)
        return self._torch.tensor(data, *a, **kw)

    def __getattr__(self, name):
        return getattr(self._torch, name)


class _IndexList(list):
    def to(self, *a, **kw):
        return self  # the row indices stay a host list


def patch(orig):
    """FACT grammar_indices_pinned (vllm#37705): in a batch mixing structured and plain requests,
    apply_grammar_bitmask pins its row-index tensor, which kills the engine without a GPU."""
    import sys
    mod = sys.modules[orig.__module__]

    def apply_grammar_bitmask(*a, **kw):
        logits = next((x for x in a if getattr(x, "is_cpu", False) and getattr(x, "dim", lambda: 0)() == 2),
                      kw.get("logits"))
        if logits is None or not logits.is_cpu or "cpu_grammar_pin" in state.PLAN.data.get("stock", ()):
            return orig(*a, **kw)
        saved = mod.torch
        mod.torch = _UnpinnedTorch(saved)
        try:
            return orig(*a, **kw)
        finally:
            mod.torch = saved
    return apply_grammar_bitmask


PATCHES = {POINT: patch}
