"""A sampling row masked for a request that asked for no mask (KNOWN_UPSTREAM vllm#43894).

V1's InputBatch keeps every row's allowed_token_ids mask in one CPU tensor, copied to the sampler
for the batch's rows whenever some request of the batch asked for allowed_token_ids. A row whose
mask is set while its request asked for none restricts that request to another request's ids:
condense moves a request to a lower row and, before 0.31.0, leaves its old row's mask set, which
the next request without allowed_token_ids placed there inherits (vllm-project/vllm#43894); on a
GPU swap_states' tuple assignment of two row views copies one row's mask into both
(vllm-project/vllm#48419). Both end the same way, which is what is counted: each time the sampling
metadata is built with the mask in force, every row whose request is not among
`has_allowed_token_ids` and whose mask row masks some token (`foreign_allowed_mask_rows`, over the
run), and per vLLM request id (`request_evidence`: {rid: {"foreign_allowed_mask": n}}, which the
oracle adds to that request's step books: harness.oracles.steps.books_of). It changes nothing.
"""
from __future__ import annotations

from collections import OrderedDict

from harness.agents.vllm import state

MECHANISM = "foreign_allowed_mask"  # the per-request evidence KNOWN_UPSTREAM vllm#43894 claims by
KEEP = 2048  # requests kept (as the step books keep theirs)
_BY_RID: OrderedDict = OrderedDict()


def foreign_rows(batch) -> list[str]:
    """The request ids whose sampling row the batch's allowed-ids mask restricts although they
    asked for no allowed_token_ids (none while no request of the batch asked for any: vLLM then
    applies no mask)."""
    mask = getattr(batch, "allowed_token_ids_mask_cpu_tensor", None)
    asked = getattr(batch, "has_allowed_token_ids", None)
    if mask is None or not asked:
        return []
    out = []
    for i, rid in enumerate(list(batch.req_ids)[:batch.num_reqs]):
        if rid is not None and rid not in asked and bool(mask[i].any()):
            out.append(rid)
    return out


def make_sampling_metadata(orig):
    def _make_sampling_metadata(self, *a, **kw):
        out = orig(self, *a, **kw)
        try:
            rids = foreign_rows(self)
            if rids:
                f = state.facts("worker")
                f.add("foreign_allowed_mask_rows", len(rids))
                for rid in rids:
                    ev = _BY_RID.setdefault(rid, {})
                    ev[MECHANISM] = ev.get(MECHANISM, 0) + 1
                while len(_BY_RID) > KEEP:
                    _BY_RID.popitem(last=False)
                f.set(request_evidence={k: dict(v) for k, v in _BY_RID.items()})
        except Exception as e:  # a counter must never break the engine
            state.facts("worker").set(counter_error=f"allowed_mask: {e}")
        return out
    return _make_sampling_metadata


PATCHES = {"allowed_mask": make_sampling_metadata}
