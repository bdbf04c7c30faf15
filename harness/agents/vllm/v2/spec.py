"""Speculative decoding's worker side on vLLM's V2 model runner (issue 43), the counterpart of
harness.agents.vllm.spec's worker counters (V1's `GPUModelRunner._sample` and rejection sampler).

The engine core's window counters (spec_windows, spec_rejections, spec_steps_in_flight, role
"spec") are the scheduler's and shared by both runners. In the worker, V2 samples a step in
`GPUModelRunner.sample`: with drafts, V2's rejection sampler (spec_decode/rejection_sampler.py)
verifies each request's drafts, which it reads back from the step's input ids at the request's
logits rows after the first (`gather_draft_sampled`: input_ids[logits_indices]); it returns the
sampled ids and how many each request kept (num_sampled). After it, per request (role
"spec_verify", the same records as V1's so harness.oracles.spec_steps judges them alike):
- a window: the drafts as verified and the ids sampled (a later sample without drafts is a window
  with none: a seeded request's draws follow it; the first token is no window; a sample thrown
  away, num_sampled 0, a partial prefill's, is none);
- `spec_lp_steps`: the steps with drafts where a penalty or bad words apply to some row. V2 reads
  no placeholder there: its penalties count output ids on the device (output_bin_counts, written
  by post_update with the accepted tokens) plus the window's own drafts from the input ids, so
  the row is judged by its requests' tokens on and off (no `spec_lp_placeholders` on V2).
The request's key (prompt ids and max_tokens, as the client knows it) is taken when V2 adds the
request to its state (`remember`, from the agent's v2_add_request counter).
"""
from __future__ import annotations

from collections import OrderedDict

from harness.agents.vllm.spec import KEEP_VERIFIED as KEEP, VERIFY_ROLE, add_window, publish_windows
from harness.agents.vllm.steps import request_key
from harness.agents.vllm.v2 import shared

_KEYS: OrderedDict = OrderedDict()  # vLLM request id -> request_key
_SAMPLED: OrderedDict = OrderedDict()  # request ids that have sampled a token in this process


def remember(req_id, prompt_ids, max_tokens) -> None:
    """The request's key, when V2 adds it (again, after a preemption: the same key)."""
    _KEYS[req_id] = request_key(prompt_ids, max_tokens)
    _KEYS.move_to_end(req_id)
    while len(_KEYS) > 4 * KEEP:
        _KEYS.popitem(last=False)


def sample(orig):
    """GPUModelRunner.sample (V2): after it, the windows of the step (see the module's doc)."""
    def _sample(self, hidden_states, input_batch, *a, **kw):
        out = orig(self, hidden_states, input_batch, *a, **kw)
        if getattr(self, "speculator", None) is not None:
            try:
                _record(self, input_batch, out[0], acceptable_drafts(a[0] if a else kw.get("grammar_output")))
            except Exception as e:  # a counter must never break the engine
                shared.facts(VERIFY_ROLE).set(counter_error=f"v2 spec_sample: {e}")
        return out
    return _sample


def acceptable_drafts(grammar_output) -> dict:
    """request id -> how many of its drafts its grammar let through (GrammarOutput's
    num_acceptable_drafts): with async scheduling the drafts reach the grammar after the forward,
    and the rejection sampler rejects the rest whatever the target says (vLLM's
    grammar_invalid_drafts; measured: a terminated regex's draft EOS rejected, then EOS sampled)."""
    ids = getattr(grammar_output, "structured_output_request_ids", None) or []
    n = getattr(grammar_output, "num_acceptable_drafts", None)
    if not ids:
        return {}
    return {rid: (int(n[i]) if n is not None else 0) for i, rid in enumerate(ids)}


def windows(batch, sampled, num_sampled, sampled_before, prefill_len, acceptable=None) -> list[tuple[str, list, list]]:
    """(request id, drafts as verified, ids kept) for each request of the batch that has a window
    this step: drafts at its logits rows after the first, as V2's rejection sampler gathers them
    (the input ids there; -1 for a slot of a step that starts inside the prefill, a placeholder it
    rejects, and for a draft past what its grammar let through (`acceptable`: request id -> that
    count), which it rejects too); `sampled_before(rid)`: it sampled a token before this step;
    `prefill_len`: per request-state row."""
    acceptable = acceptable or {}
    cu = [int(x) for x in batch.cu_num_logits_np[:batch.num_reqs + 1]]
    ids = []
    if batch.num_draft_tokens:
        ids = batch.input_ids[batch.logits_indices].tolist()
        pos = batch.positions[batch.logits_indices].tolist()
        for i in range(batch.num_reqs):
            pre = int(prefill_len[int(batch.idx_mapping_np[i])])
            for local, j in enumerate(range(cu[i], cu[i + 1])):
                if local > 0 and pos[j] - local < pre:
                    ids[j] = -1
    out = []
    for i, rid in enumerate(batch.req_ids[:batch.num_reqs]):
        got = [int(t) for t in sampled[i][:int(num_sampled[i])] if t >= 0]
        if not got:
            continue  # a partial prefill's sample, thrown away: no window
        n = cu[i + 1] - cu[i] - 1
        if n <= 0 and not sampled_before(rid):
            continue  # the request's first token: no window
        drafts = [int(t) for t in ids[cu[i] + 1:cu[i + 1]]] if n > 0 else []
        if rid in acceptable:
            drafts = [t if k < acceptable[rid] else -1 for k, t in enumerate(drafts)]
        out.append((rid, drafts, got))
    return out


def _record(runner, batch, so, acceptable=None) -> None:
    import numpy as np
    sampled = so.sampled_token_ids.tolist()
    ns = so.num_sampled.tolist()
    wins = windows(batch, sampled, ns, lambda rid: rid in _SAMPLED, runner.req_states.prefill_len.np, acceptable)
    for rid, drafts, got in wins:
        add_window(rid, lambda: _KEYS.get(rid, f"?:{rid}"), drafts, got)
    for i, rid in enumerate(batch.req_ids[:batch.num_reqs]):
        if int(ns[i]) > 0:
            _SAMPLED[rid] = True
            while len(_SAMPLED) > 4 * KEEP:
                _SAMPLED.popitem(last=False)
    if wins:
        publish_windows()
    if batch.num_draft_tokens and runner.sampler is not None:
        rows = batch.idx_mapping_np
        pen = runner.sampler.penalties_state.use_penalty[rows]
        bad = [p.num_bad_words.np[rows] for p in runner.sampler.logits_processors if type(p).__name__ == "BadWordsState"]
        if bool(np.any(pen)) or any(bool(np.any(b > 0)) for b in bad):
            shared.facts("worker").add("spec_lp_steps")


# the agent's patch point (harness.agents.vllm.v2.points) this wraps
PATCHES = {"v2_spec_sample": sample}
