"""Path counters: how often each attacked path ran, counted from inside vLLM, so that a suite
attacking a path can fail as "not exercised" (harness.targets.vllm.paths: each row names the
counters that prove its path ran). COUNTERS maps a patch point (harness.agents.vllm.points) to
(role, counter, condition); each is installed where the release has the point (elsewhere the
row is n/a).
"""
from __future__ import annotations

from harness.agents.vllm import state

SCHEDULED = {"tokens": -1}  # the tokens the engine core's latest schedule() gave (-1: none yet; books.py reads it)


def custom_lp_facts(batch) -> None:
    """Right before the sampler (and the logits processors) read the output ids: in a step with a
    processor that is not vLLM's own (entry point or CLI), count the step and the rows whose
    newest output id is still a placeholder (-1), which every such processor would read there
    (vllm#52461): evidence for a processor we did not write and cannot count inside."""
    procs = getattr(getattr(batch, "logitsprocs", None), "all", None) or ()
    if not any(not type(p).__module__.startswith("vllm.") for p in procs):
        return
    f = state.facts("worker")
    f.add("custom_lp_steps")
    n = sum(1 for ids in batch.req_output_token_ids[:batch.num_reqs] if ids and ids[-1] == -1)
    if n:
        f.add("lp_visible_placeholders", n)


# inside an engine step (a preemption there is the scheduler's, for KV space), and whether a
# batch was in flight then (async: the scheduler works on step N+1 while N runs)
_IN_FLIGHT = {"engine": False, "step": False}


def counting(role: str, key, when=None):
    """A patch that calls the original and adds to `key` (a name, or fn(self, args, result) ->
    {name: n}) when `when(self, args, result)` holds."""
    def make(orig):
        fn = orig.__func__ if isinstance(orig, staticmethod) else orig

        def counted(*a, **kw):
            out = fn(*a, **kw)
            a = a + tuple(kw.values())  # keyword arguments in the signature's order, as callers pass them
            try:
                if when is None or when(a, out):
                    counts = key(a, out) if callable(key) else {key: 1}
                    f = state.facts(role)
                    for k, n in counts.items():
                        if n:
                            f.add(k, n)
            except Exception as e:  # a counter must never break the engine
                state.facts(role).set(counter_error=f"{key}: {e}")
            return out
        return staticmethod(counted) if isinstance(orig, staticmethod) else counted
    return make


def engine_step_in_flight(orig):
    def step_with_batch_queue(self):
        q = self.batch_queue
        _IN_FLIGHT["engine"] = q is not None and len(q) >= 1
        _IN_FLIGHT["step"] = True
        try:
            return orig(self)
        finally:
            _IN_FLIGHT["engine"] = _IN_FLIGHT["step"] = False
    return step_with_batch_queue


def engine_step_sync_flag(orig):
    def step(self, *a, **kw):
        _IN_FLIGHT["step"] = True
        try:
            return orig(self, *a, **kw)
        finally:
            _IN_FLIGHT["step"] = False
    return step


def _preempted(a, out):
    return {"preemptions": 1, "preemptions_kv": int(_IN_FLIGHT["step"]),
            "preemptions_in_flight": int(_IN_FLIGHT["engine"])}


def _scheduled(a, out):
    """Per schedule: requests given only part of their prompt (chunked prefill), and the sampling
    steps of requests with max_tokens 1 or 2 (a step samples once the request's known tokens
    are all computed)."""
    sched = a[0]
    SCHEDULED["tokens"] = int(getattr(out, "total_num_scheduled_tokens", -1))  # the books' livelock check
    counts = {"chunked_prefills": 0, "sampled_max1": 0, "sampled_max2": 0}
    for rid in out.num_scheduled_tokens:
        r = sched.requests.get(rid)
        if r is None:
            continue
        if r.num_computed_tokens < r.num_prompt_tokens:
            counts["chunked_prefills"] += 1
        elif r.max_tokens in (1, 2) and r.num_computed_tokens >= r.num_tokens:
            counts[f"sampled_max{r.max_tokens}"] += 1
    return counts


def _added(a, out):
    r = a[1]
    sp = r.sampling_params
    return {"seeded_requests": int(sp.seed is not None), "logprob_requests": int(bool(sp.logprobs)),
            f"max{sp.max_tokens}_requests": int(sp.max_tokens in (1, 2)),
            "stop_token_id_requests": int(bool(sp.stop_token_ids))}


def _aborted(a, out):
    ids, status = (a[1], a[2]) if len(a) > 2 else (a[1], None)
    if status is None or getattr(status, "name", "") != "FINISHED_ABORTED":
        return {}
    return {"aborted_requests": 1 if isinstance(ids, str) else len(list(ids or ()))}


def _stop_token(a, out):
    r = a[0]
    return {"stop_token_stops": int(bool(out) and isinstance(r.stop_reason, int))}


def _prefix_hit(a, out):
    n = int(out[1])
    return {"prefix_hits": int(n > 0), "prefix_hit_tokens": n}


COUNTERS = {
    "preempt": ("engine", _preempted, None),
    "schedule": ("engine", _scheduled, None),
    "sched_add": ("engine", _added, None),
    "finish": ("engine", _aborted, None),
    "reset_cache": ("engine", "prefix_cache_resets", lambda a, out: bool(out)),
    "check_stop": ("engine", _stop_token, None),
    "prefix_lookup": ("engine", _prefix_hit, None),
    "pause": ("engine", "pauses", None),
    "resume": ("engine", "resumes", None),
    "stop_strings": ("api", "stop_string_stops", lambda a, out: out is not None),
    "parallel_sampling": ("api", "parallel_parents", None),
    "penalties": ("worker", "penalty_steps", lambda a, out: not a[1].no_penalties),
    "bad_words": ("worker", "bad_words_steps", lambda a, out: bool(a[1])),
    "min_tokens": ("worker", "min_tokens_steps", lambda a, out: bool(a[0].min_toks)),
    "logit_bias": ("worker", "logit_bias_steps", lambda a, out: bool(a[0].biases)),
    "batch_condense": ("worker", "seeded_reorders", lambda a, out: bool(a[0].generators)),
    "batch_swap": ("worker", "seeded_reorders", lambda a, out: bool(a[0].generators)),
    "grammar": ("worker", "grammar_steps", None),
}
