"""The agent's workarounds for bugs of vLLM itself, one module each, each installed only where the
release fact that says the bug is there holds (harness.targets.vllm.releases FACTS; the module's
FACT), so the gate's rows run past a bug the project has recorded (KNOWN_UPSTREAM) instead of
dying on it. Each module names its FACT (None: wherever its patch points exist), its PATCHES
(patch point -> patch) and the plan's "stock" switch that leaves vLLM's own code in place (what its
reproducer in fixtures/vllm_upstream/ runs).
"""
from __future__ import annotations

from harness.agents.vllm.workarounds import (cpu_expand, cpu_reorder, discard_mark, eager_warmup, generator_rewind,
                                             grammar_indices, ipex_decode, mixed_seeds, pp_receive_buffer, reader_wait,
                                             spec_topk_no_drafts)

# in the order the agent installs them (the order of wrapping where two share a point)
MODULES = (generator_rewind, mixed_seeds, grammar_indices, ipex_decode, cpu_reorder, discard_mark, eager_warmup, cpu_expand,
           spec_topk_no_drafts, pp_receive_buffer, reader_wait)

# release fact -> (patch point, the patch): installed only in the releases the fact holds in
WORKAROUNDS = {m.FACT: (m.POINT, m.patch) for m in MODULES if m.FACT}
