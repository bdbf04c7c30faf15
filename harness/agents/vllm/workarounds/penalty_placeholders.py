"""Penalties given the newest output id, not its -1 placeholder, under async scheduling (vllm#26467).

Before 0.11.1 nothing repairs the placeholder the model runner keeps for a request's token still
in flight, so a penalised request's next step reads -1 as its newest output id: the repetition
penalty indexes the logits with it and the engine dies ("index -1 is out of bounds"), and every
later case of the gate's run dies with it (the sweep of 0.11.0 on 2026-12-05: 23 rows CRASH).
Turned on where the release table's fact penalties_read_placeholders holds (before 0.11.1): the
penalties alone get a repaired copy of the output ids (the previous step's sampled ids, as
0.11.1's fix reads them), so the rows run and are judged; the logits processors still read what
vLLM gives them (the bare rows' known bug, vllm#26467 there too, stays visible). Counted, so the
gate reports the known bug as reached; "async_penalty_ids" under the plan's "stock" leaves
vLLM's own path (what the reproducer runs).
"""
from __future__ import annotations

import dataclasses

from harness.agents.vllm import state

FACT = "penalties_read_placeholders"  # harness.targets.vllm_releases FACTS: the releases it holds in
POINT = "penalties"  # the repair (runner_sample only keeps the batch at hand for it)
_BATCH: list = [None]  # the input batch of the step being sampled (the worker samples one step at a time)


def around_sample(orig):
    """Keep the runner's input batch at hand while its step samples: the previous step's sampled
    ids and which row each request had there (prev_sampled_token_ids, prev_req_id_to_index)."""
    def _sample(self, *a, **kw):
        _BATCH[0] = self.input_batch if getattr(self, "use_async_scheduling", False) else None
        try:
            return orig(self, *a, **kw)
        finally:
            _BATCH[0] = None
    return _sample


def repaired(output_token_ids, batch):
    """A copy of the output ids with each row's trailing -1 replaced by the id the previous step
    sampled for that request, and how many were replaced (0: the rows themselves, unchanged)."""
    prev, where = getattr(batch, "prev_sampled_token_ids", None), getattr(batch, "prev_req_id_to_index", None)
    if prev is None or not where:
        return output_token_ids, 0
    ids, out, n = None, list(output_token_ids), 0
    for i, rid in enumerate(batch.req_ids[:len(out)]):
        j, row = where.get(rid), out[i]
        if j is None or not row or row[-1] != -1:
            continue
        if ids is None:
            ids = prev[:, 0].tolist()  # the worker's own copy of the ids it just sampled
        out[i], n = list(row[:-1]) + [int(ids[j])], n + 1
    return (out, n) if n else (output_token_ids, 0)


def around_penalties(orig):
    def apply_penalties(self, logits, sampling_metadata, *a, **kw):
        batch = _BATCH[0]
        if batch is not None and not sampling_metadata.no_penalties and sampling_metadata.output_token_ids:
            fixed, n = repaired(sampling_metadata.output_token_ids, batch)
            if n:
                state.facts("worker").add("penalty_placeholders", n)
                if "async_penalty_ids" not in state.PLAN.data.get("stock", ()):
                    sampling_metadata = dataclasses.replace(sampling_metadata, output_token_ids=fixed)
        return orig(self, logits, sampling_metadata, *a, **kw)
    return apply_penalties


patch = around_penalties  # the repair at POINT (WORKAROUNDS names each module's by its fact)
PATCHES = {"runner_sample": around_sample, POINT: patch}
