"""Seeds kept in a batch that mixes seeded and unseeded requests, on CPU (vllm#51226).

Turned on where the release table's fact cpu_sampler_ignores_mixed_seeds holds (0.11.0 up to
0.29.0); "cpu_mixed_seeds" under the plan's "stock" leaves vLLM's own path (reproducer:
fixtures/vllm_upstream/cpu_mixed_seed_batch.json).
"""
from __future__ import annotations

from harness.agents.vllm import state

FACT = "cpu_sampler_ignores_mixed_seeds"  # harness.targets.vllm.releases FACTS: the releases it holds in
POINT = "cpu_sampler"


def patch(orig):
    """FACT cpu_sampler_ignores_mixed_seeds (vllm#51226): forward_cpu takes its unseeded fast path
    whenever not every row has a generator, so in a batch mixing seeded and unseeded requests the
    seeds are ignored and a seeded request's tokens depend on what it is batched with (async on and
    off batch differently). Every unseeded row gets a fresh generator seeded from the global RNG
    (still random), so vLLM's own generator loop runs and every seed holds."""
    def forward_cpu(self, logits, generators, *a, **kw):
        if generators and len(generators) != logits.shape[0]:
            state.facts("worker").add("cpu_mixed_seed_batches")
            if "cpu_mixed_seeds" not in state.PLAN.data.get("stock", ()):
                import torch
                filled = dict(generators)
                for i in range(logits.shape[0]):
                    if i not in filled:
                        g = torch.Generator(device=logits.device)
                        g.manual_seed(int(torch.randint(0, 2 ** 62, (1,)).item()))
                        filled[i] = g
                generators = filled
        return orig(self, logits, generators, *a, **kw)
    return forward_cpu


PATCHES = {POINT: patch}
