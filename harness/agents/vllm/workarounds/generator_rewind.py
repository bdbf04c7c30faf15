"""CUDA's generator rewind, on CPU (KNOWN_UPSTREAM cpu-seeded-partial-prefill).

When vLLM discards the sample of a seeded request's partial prefill, GPUModelRunner._bookkeeping_sync
rewinds the request's generator by offset (`set_offset(get_offset() - 4)`), a call only CUDA
generators have: vLLM's CPU build dies there. The agent snapshots each CPU generator's state before
a sample (Sampler.forward) and, while vLLM rewinds, hands it a stand-in whose set_offset restores
that state: what the CUDA rewind achieves. It also counts the seeded samples vLLM discards (a path
counter of the `seeded` row).

Turned on by no release fact: installed wherever the release has its points (bookkeeping from
0.10.2). With "cpu_generator_rewind" under the plan's "stock", vLLM's own call runs (reproducer:
fixtures/vllm_upstream/cpu_seeded_partial_prefill.json).
"""
from __future__ import annotations

from harness.agents.vllm import state

FACT = None  # installed wherever its points exist

_GEN_STATES: dict = {}  # batch index -> (generator, its state before this step's sample)


def sampler_forward(orig):
    def forward(self, logits, sampling_metadata, *a, **kw):
        _GEN_STATES.clear()
        for i, g in (sampling_metadata.generators or {}).items():
            if g.device.type == "cpu":
                _GEN_STATES[i] = (g, g.get_state())
        return orig(self, logits, sampling_metadata, *a, **kw)
    return forward


class _Rewind:
    """Stands in for a CPU generator while vLLM rewinds it by offset (a CUDA-only call): the
    rewind restores the state from before the discarded sample, which is what the CUDA rewind
    achieves."""

    def __init__(self, gen, state):
        self.gen, self.state = gen, state

    def get_offset(self):
        return 4

    def set_offset(self, offset):
        if self.state is not None:
            self.gen.set_state(self.state)
            state.facts("worker").add("cpu_generator_rewinds")


def bookkeeping(orig):
    def _bookkeeping_sync(self, *a, **kw):
        gens = self.input_batch.generators
        mask = getattr(getattr(self, "discard_request_mask", None), "np", None)
        if mask is not None:
            discarded = mask[:self.input_batch.num_reqs].nonzero()[0]
        else:  # before 0.13: the discarded rows' indices, and how many there are
            idx = getattr(getattr(self, "discard_request_indices", None), "np", None)
            discarded = idx[:getattr(self, "num_discarded_requests", 0)] if idx is not None else ()
        if gens:  # path count: seeded samples vLLM discards (a partial prefill)
            n = sum(1 for i in discarded if int(i) in gens)
            if n:
                state.facts("worker").add("seeded_discards", n)
        if "cpu_generator_rewind" in state.PLAN.data.get("stock", ()):
            return orig(self, *a, **kw)
        real = {i: g for i, g in gens.items() if isinstance(g, __import__("torch").Generator)
                and g.device.type == "cpu"}
        for i, g in real.items():
            st = _GEN_STATES.get(i)
            gens[i] = _Rewind(g, st[1] if st is not None and st[0] is g else None)
        try:
            return orig(self, *a, **kw)
        finally:
            for i, g in real.items():
                if isinstance(gens.get(i), _Rewind):
                    gens[i] = g
    return _bookkeeping_sync


PATCHES = {"sampler_forward": sampler_forward, "bookkeeping": bookkeeping}
