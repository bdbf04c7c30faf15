"""IPEX's VNNI decode kernel, which rejects every call without a sliding window (IPEX 2.8).

Turned on where the release table's fact ipex_vnni_rejects_no_window holds (0.11.0 up to 0.11.1:
vLLM decodes with IPEX there, and that release's IPEX is 2.8); "ipex_vnni_window" under the plan's
"stock" lets the rejection stand (reproducer: fixtures/vllm_upstream/cpu_ipex_vnni_decode.json).
"""
from __future__ import annotations

import os

from harness.agents.vllm import state

FACT = "ipex_vnni_rejects_no_window"  # harness.targets.vllm.releases FACTS: the releases it holds in
POINT = "ipex_decode"


_IPEX_KERNEL_ENV = "PAGED_ATTENTION_SINGLE_QUERY_KERNEL"  # IPEX reads it on every call; 1: flash decoding


def patch(orig):
    """FACT ipex_vnni_rejects_no_window (IPEX 2.8, vLLM 0.11.0): IPEX's decode takes a batch whose
    first 4+ rows share their first KV block (a prefix-cache hit) for beams and picks its VNNI
    kernel, which rejects every call without a sliding window, vLLM's only kind. The check is the
    kernel's first statement (nothing is written yet), so the call is run again on the kernel IPEX
    picks for every other batch, and counted."""
    fn = orig.__func__ if isinstance(orig, staticmethod) else orig

    def forward_decode(*a, **kw):
        try:
            return fn(*a, **kw)
        except RuntimeError as e:
            if "Sliding window unsupported" not in str(e):
                raise
            state.facts("worker").add("ipex_vnni_decodes")
            if "ipex_vnni_window" in state.PLAN.data.get("stock", ()):
                raise
        saved = os.environ.get(_IPEX_KERNEL_ENV)
        os.environ[_IPEX_KERNEL_ENV] = "1"
        try:
            return fn(*a, **kw)
        finally:
            if saved is None:
                os.environ.pop(_IPEX_KERNEL_ENV, None)
            else:
                os.environ[_IPEX_KERNEL_ENV] = saved
    return staticmethod(forward_decode)


PATCHES = {POINT: patch}
