"""Speculative decoding's steps, counted from inside vLLM (issue 43, item 2).

The scheduler learns what a step with drafts did in Scheduler.update_from_output: for each request
it had scheduled drafts for (scheduler_output.scheduled_spec_decode_tokens), the rejection
sampler's tokens come back as that request's sampled ids: the accepted drafts, then one token of
the target's own (the bonus token after a window accepted whole, the correction after a
rejection). vLLM rolls num_computed_tokens (and, async, num_output_placeholders) back by the
rejected count there. So, per step with drafts (engine core, role "spec"):
- `spec_steps`, `spec_steps_in_flight` (one with a batch still in flight: async only);
- `spec_windows` (request-steps with drafts that sampled), `spec_drafts` (drafts scheduled),
  `spec_accepted`, `spec_full` (windows accepted whole: the bonus token), `spec_rejections` (a
  draft rejected), `spec_rejected_all`; `spec_stale_windows` (a window whose frame a preemption
  made stale: it returns after the request was preempted), `spec_stale_drop_rejections` (one a
  reset's drop mode throws away, with a draft rejected: vllm#46066's class), `spec_stale_drop_resumed`
  (such a window met by its request resumed whole already: the shape where that class shows);
  after every step's update, `placeholders_below_zero`: running requests whose output placeholders
  are below 0 (a violation; `first_placeholders_below_zero` keeps what the first held);
and per request (by the steps books' key: prompt ids and max_tokens), each window's drafts and
accepted length, so the arms compare them for greedy requests (harness.oracles.spec_steps).

In the worker, the rejection sampler applies penalties and bad words to the output ids with
the drafts appended (RejectionSampler.apply_logits_processors); under async scheduling those
ids end in placeholders vLLM repairs first (InputBatch.update_async_output_token_ids). A
placeholder left there is read as a token (vllm#30122: only the last accepted token repaired):
`spec_lp_steps` counts the steps with a penalty or bad words, `spec_lp_placeholders` the
placeholder ids read in the rows a penalty or bad words apply to (a violation: > 0 fails its
row; the other rows may hold -1 by vLLM's design, counted apart). After the rejection sampler
(GPUModelRunner._sample) the worker records each request's drafts as it verified them and the
ids it sampled, per window (role "spec_verify"; a later sample without drafts is a window with none):
the verify rule is checked on them (harness.oracles.spec_steps.verify_findings).
"""
from __future__ import annotations

from collections import OrderedDict

from harness.agents.vllm import state
from harness.agents.vllm.steps import KEEP, request_key

ROLE = "spec"
_ACCEPTED: OrderedDict = OrderedDict()  # vLLM request id -> [key, [[drafts, accepted] per window]]


def _window(rid, req, n_drafts: int, n_sampled: int) -> int:
    """One request's window: its accepted drafts (the sampled ids less the target's own one)."""
    accepted = max(n_sampled - 1, 0)
    rec = _ACCEPTED.get(rid)
    if rec is None:
        cap = getattr(req, "max_tokens", None)
        if cap is None:
            cap = getattr(getattr(req, "sampling_params", None), "max_tokens", None)
        rec = _ACCEPTED[rid] = [request_key(getattr(req, "prompt_token_ids", None) or (), cap), []]
        while len(_ACCEPTED) > KEEP:
            _ACCEPTED.popitem(last=False)
    rec[1].append([n_drafts, accepted])
    return accepted


def update_from_output(orig):
    def update(self, scheduler_output, model_runner_output, *a, **kw):
        try:
            counts = _count(self, scheduler_output, model_runner_output)
        except Exception as e:  # a counter must never break the engine
            counts = {}
            state.facts(ROLE).set(counter_error=f"spec: {e}")
        out = orig(self, scheduler_output, model_runner_output, *a, **kw)
        try:
            below = _placeholders_below_zero(self)
        except Exception as e:  # a counter must never break the engine
            below = {}
            state.facts(ROLE).set(counter_error=f"spec placeholders: {e}")
        if below:
            f = state.facts(ROLE)
            f.add("placeholders_below_zero", below["n"])
            if not f.data.get("first_placeholders_below_zero"):
                f.set(first_placeholders_below_zero=below["first"])
        if counts:
            f = state.facts(ROLE)
            for k, n in counts.items():
                if n:
                    f.add(k, n)
            f.set(accepted={rid: [k, list(v)] for rid, (k, v) in _ACCEPTED.items()})
        return out
    return update


def _placeholders_below_zero(sched) -> dict:
    """The running requests whose output placeholders are below 0 once a step's output is applied
    ({"n", "first": what the first held}, or {}). A count of tokens in flight cannot be negative:
    vLLM asserts it only where a token is delivered (AsyncScheduler._update_request_with_output),
    and the next step's placeholders, added before that, can lift a wrong count back over 0 (a
    stale frame's rejections applied to a request resumed whole, vllm#46066: measured so, the
    engine lived and its tokens stayed equal); so the agent checks after every update."""
    bad = [r for r in getattr(sched, "running", ()) or () if int(getattr(r, "num_output_placeholders", 0) or 0) < 0]
    if not bad:
        return {}
    r = bad[0]
    return {"n": len(bad), "first": {"request": str(getattr(r, "request_id", "?"))[:40],
                                     "placeholders": int(r.num_output_placeholders),
                                     "num_computed_tokens": int(getattr(r, "num_computed_tokens", 0) or 0),
                                     "num_tokens": int(getattr(r, "num_tokens", 0) or 0),
                                     "preemptions": int(getattr(r, "num_preemptions", 0) or 0)}}


def _count(sched, so, mro) -> dict:
    """Read before vLLM's own update (it trims the requests it finishes)."""
    drafts = getattr(so, "scheduled_spec_decode_tokens", None) or {}
    sampled = getattr(mro, "sampled_token_ids", None)
    index = getattr(mro, "req_id_to_index", None) or {}
    if not drafts or not sampled:
        return {}
    from harness.agents.vllm import counters
    c = {"spec_steps": 1, "spec_steps_in_flight": int(bool(counters._IN_FLIGHT.get("engine")))}
    for rid, ids in drafts.items():
        i = index.get(rid)
        req = sched.requests.get(rid)
        if i is None or req is None or i >= len(sampled):
            continue
        got = sampled[i]
        got = list(got.tolist() if hasattr(got, "tolist") else got)
        if not got:
            continue  # a discarded sample (a partial prefill): no window
        # async, the scheduled drafts are placeholders (-1) the worker fills from its own copy; a
        # grammar's invalid ones are counted apart (vLLM's make_spec_decoding_stats does the same)
        k = len(ids) - int((getattr(so, "num_invalid_spec_tokens", None) or {}).get(rid, 0))
        acc = _window(rid, req, k, len(got))
        c["spec_windows"] = c.get("spec_windows", 0) + 1
        c["spec_drafts"] = c.get("spec_drafts", 0) + k
        c["spec_accepted"] = c.get("spec_accepted", 0) + acc
        c["spec_full"] = c.get("spec_full", 0) + int(k > 0 and acc >= k)
        c["spec_rejected_all"] = c.get("spec_rejected_all", 0) + int(k > 0 and acc == 0)
        c["spec_rejections"] = c.get("spec_rejections", 0) + int(acc < k)
        if int(getattr(req, "num_stale_output_tokens", 0) or 0) > 0:  # a frame a preemption made stale
            # (harness.agents.vllm.spec_patches: where vllm#46066's class lives; a reset's is drop mode)
            drop = bool(getattr(req, "drop_stale_output", False))
            c["spec_stale_windows"] = c.get("spec_stale_windows", 0) + 1
            c["spec_stale_drop_rejections"] = c.get("spec_stale_drop_rejections", 0) + int(drop and acc < k)
            # ... met by its request already resumed whole in the schedule after the reset (its new
            # step's placeholder held): the one shape where applying those rejections shows
            # (placeholders below 0, vLLM's assertion); resumed in chunks, nothing to roll back shows
            resumed = drop and acc < k and int(getattr(req, "num_output_placeholders", 0) or 0) > 0
            c["spec_stale_drop_resumed"] = c.get("spec_stale_drop_resumed", 0) + int(resumed)
    return c


def apply_logits_processors(orig):
    def apply(self, logits, sampling_metadata, metadata, *a, **kw):
        try:
            if sampling_metadata.bad_words_token_ids or not sampling_metadata.no_penalties:
                _count_reads(sampling_metadata, metadata)
        except Exception as e:  # a counter must never break the engine
            state.facts("worker").set(counter_error=f"spec_lp: {e}")
        return orig(self, logits, sampling_metadata, metadata, *a, **kw)
    return apply


def reading_rows(sm) -> set:
    """The batch rows whose output ids a penalty or bad words actually read: a row with a penalty
    that changes something, or bad words. vLLM builds the ids of every row, and lets the rows of
    the other requests hold -1 (apply_all_penalties masks them: "rows that won't have penalties
    applied may contain -1 placeholder token ids"), so only these rows' placeholders are reads."""
    rows = set(sm.bad_words_token_ids or ())
    if not sm.no_penalties:
        pen = (sm.presence_penalties != 0) | (sm.frequency_penalties != 0) | (sm.repetition_penalties != 1)
        rows |= {int(i) for i in pen.nonzero().flatten().tolist()}
    return rows


def _count_reads(sm, metadata) -> None:
    """`spec_lp_steps`; the placeholders (-1) in the output ids and in the drafts the rejection
    sampler appends to them (spec_token_ids) of the rows it reads (`spec_lp_placeholders`, a
    violation), the first few such rows' tails (`spec_lp_rows`: what was read, to explain a read);
    the rows that hold -1 without being read are counted apart (`spec_lp_unread_placeholders`), and
    so are padded drafts (`spec_lp_padded_drafts`, see padded_drafts)."""
    f = state.facts("worker")
    f.add("spec_lp_steps")
    rows = reading_rows(sm)
    outs = sm.output_token_ids or ()
    specs = sm.spec_token_ids or [()] * len(outs)
    drafts = list(getattr(metadata, "num_draft_tokens", None) or ())
    verified = _verified_drafts(metadata, drafts)
    read = unread = padded = 0
    for i, (ids, sp) in enumerate(zip(outs, specs)):
        pad = padded_drafts(sp, verified[i] if i < len(verified) else None)
        n = sum(1 for t in ids if t == -1) + sum(1 for t in sp or () if t == -1) - pad
        if i not in rows:
            unread += n + pad
            continue
        padded += pad
        if pad:  # the first few, with what the batch says of them (a padded row was left out of a step)
            kept = f.data.get("spec_lp_padded_rows") or []
            if len(kept) < 4:
                f.set(spec_lp_padded_rows=kept + [{"row": i, "drafts": list(sp or ()), "verified": verified[i],
                                                   **_explain(i, ids)}])
        if not n:
            continue
        read += n
        seen = f.data.get("spec_lp_rows") or []
        if len(seen) < 8:
            f.set(spec_lp_rows=seen + [{"row": i, "tail": list(ids[-6:]), "drafts": list(sp or ()),
                                        "num_drafts": drafts[i] if i < len(drafts) else None,
                                        "verified": verified[i] if i < len(verified) else None,
                                        **_explain(i, ids)}])
    if read:
        f.add("spec_lp_placeholders", read)
    if unread:
        f.add("spec_lp_unread_placeholders", unread)
    if padded:
        f.add("spec_lp_padded_drafts", padded)


def padded_drafts(sp, verified) -> int:
    """The -1s of a row's drafts (sampling metadata's spec_token_ids) that are padding, not a draft
    left unrepaired: the draft the rejection sampler verifies at that position is -1 too. vLLM pads
    drafts so where it has none to give (a request left out of the previous step is scheduled its
    placeholder drafts again: the worker has no draft for it, feeds token 0 (`input_ids.clamp_(min=0)`:
    "Clamp speculative scheduler placeholders (-1)") and verifies -1), and its kernels reject a -1
    draft ("-1 is used for padded draft token ids that should be rejected"); the penalties read a
    draft only at the positions after it, so a padded draft's reads are at positions discarded by
    that rejection and change no token. A -1 where a real draft was verified is a read (the repair
    of the drafts missed it); without the verified drafts every -1 is one."""
    if not sp or verified is None:
        return 0
    return sum(1 for d, t in enumerate(sp) if t == -1 and d < len(verified) and verified[d] < 0)


def _verified_drafts(metadata, counts: list) -> list:
    """Each row's drafts as the rejection sampler verifies them (SpecDecodeMetadata.draft_token_ids,
    flat, read before the model's clamp), or [] when the metadata has none."""
    flat = getattr(metadata, "draft_token_ids", None)
    if flat is None:
        return []
    flat = flat.tolist() if hasattr(flat, "tolist") else list(flat)
    out, at = [], 0
    for n in counts:
        out.append(flat[at:at + n])
        at += n
    return out


_RUNNER: list = [None]  # the GPUModelRunner whose step the rejection sampler is sampling (set by `sample`)


def _explain(i: int, ids) -> dict:
    """What the runner's batch says about a read row, so a read can be told apart by its cause: the
    request, where its -1s sit (counted from the end: -1 is the last id), whether it was in the
    previous step's batch (vLLM repairs only those: InputBatch.update_async_output_token_ids),
    the draft count that step scheduled for it (prev_num_draft_len: the placeholders _update_states
    added), whether the repair had the previous step's ids, and those ids."""
    runner = _RUNNER[0]
    batch = getattr(runner, "input_batch", None)
    if batch is None:
        return {}
    try:
        rid = batch.req_ids[i]
        prev = (batch.prev_req_id_to_index or {}).get(rid)
        st = runner.requests.get(rid)
        cpu = batch.sampled_token_ids_cpu
        return {"rid": rid, "n_out": len(ids), "at": [j - len(ids) for j, t in enumerate(ids) if t == -1],
                "in_prev_step": prev is not None, "prev_num_draft_len": getattr(st, "prev_num_draft_len", None),
                "repair_armed": cpu is not None,
                "prev_sampled": cpu[prev].tolist() if cpu is not None and prev is not None and prev < len(cpu) else None}
    except Exception as e:  # a diagnosis must never break the engine
        return {"explain_error": str(e)[:200]}


VERIFY_ROLE = "spec_verify"
_VERIFIED: OrderedDict = OrderedDict()  # vLLM request id -> [key, [[drafts, sampled] per window]]
KEEP_VERIFIED = 512  # requests whose windows the worker keeps (a gate sends a few dozen with drafts)


def sample(orig):
    """GPUModelRunner._sample: after the rejection sampler, each request's drafts as the worker
    verified them (the real ids, also under async scheduling, where the scheduler only holds
    placeholders) and the ids it sampled for them, per window (role "spec_verify"): the verify
    rule is then checked window by window (harness.oracles.spec_steps.verify_findings)."""
    def _sample(self, logits, spec_decode_metadata, *a, **kw):
        _RUNNER[0] = self  # a placeholder read in the rejection sampler is explained from its batch
        out = orig(self, logits, spec_decode_metadata, *a, **kw)
        if spec_decode_metadata is not None:
            try:
                _record(self, spec_decode_metadata, out)
            except Exception as e:  # a counter must never break the engine
                state.facts(VERIFY_ROLE).set(counter_error=f"spec_sample: {e}")
        return out
    return _sample


def _sampled_before(runner, rid) -> bool:
    """The request has sampled before this step (not its first token). Every later sample without
    drafts is kept as a window with none: a decode step the token budget left one position, or the
    recompute of a request resumed after a preemption (a reset, a pause, KV pressure), whose sample
    is a prefill's. Such a sample draws from a seeded request's generator otherwise than a window
    does (no uniforms, no recovered-token noise), so two arms whose windows part there must be seen
    to part (spec_steps.sampled_apart), not aligned window by window as if both had drafted. (A
    resumed request's discarded chunk is kept too: the arms part, which only leaves it uncompared.)"""
    st = runner.requests.get(rid)
    return bool(getattr(st, "output_token_ids", None))


def _record(runner, md, out) -> None:
    counts = list(md.num_draft_tokens)
    flat = md.draft_token_ids.tolist()
    sampled = out.sampled_token_ids.tolist()
    rids = runner.input_batch.req_ids
    at = 0
    for i, n in enumerate(counts):
        drafts, at = flat[at:at + n], at + n
        if i >= len(rids) or i >= len(sampled):
            continue
        if not n and not _sampled_before(runner, rids[i]):
            continue  # the request's first token: no window
        st = runner.requests.get(rids[i])
        sp = getattr(st, "sampling_params", None)
        add_window(rids[i], lambda: request_key(getattr(st, "prompt_token_ids", None) or (),
                                                getattr(sp, "max_tokens", None)),
                   drafts, [t for t in sampled[i] if t >= 0])
    publish_windows()


def add_window(rid, key, drafts: list, sampled: list) -> None:
    """One verified window of request `rid` (drafts as verified, ids kept); `key()` gives its
    request_key the first time the request is seen. Both runners' worker sides keep their windows
    here (V2: harness.agents.vllm.v2.spec)."""
    rec = _VERIFIED.get(rid)
    if rec is None:
        rec = _VERIFIED[rid] = [key(), []]
        while len(_VERIFIED) > KEEP_VERIFIED:
            _VERIFIED.popitem(last=False)
    rec[1].append([drafts, sampled])


def publish_windows() -> None:
    """The windows kept so far, as the worker's facts (role spec_verify: harness.oracles.spec_steps)."""
    state.facts(VERIFY_ROLE).set(verified={rid: [k, w] for rid, (k, w) in _VERIFIED.items()})


# the agent's patch points (harness.agents.vllm.points) these counters wrap
PATCHES = {"spec_update": update_from_output, "spec_logits": apply_logits_processors, "spec_sample": sample}
