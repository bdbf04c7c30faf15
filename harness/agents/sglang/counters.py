"""The paths, counted on both arms (facts `path_*`, what "not exercised" is judged by): what a
launched step exercises (count_paths, called from the launch: harness.agents.sglang.timing), and
the points that count a path of their own: a retraction, a request finishing while its next step
is in flight, an abort of a running or in-flight request, a sample delayed behind the grammar, and
the penalties that take in a token one step old.
"""
from __future__ import annotations

from harness.agents.sglang.steps import client_key


def count_paths(agent, sched, batch) -> None:
    """What a launched step exercises (facts `path_*`): a prefill chunk of a longer prompt, a
    first extend that starts from a cached prefix, a decode step whose input ids come from the
    relay (FutureMap), penalties and grammar that read the newest token."""
    reqs = list(getattr(batch, "reqs", None) or ())
    mode = getattr(batch, "forward_mode", None)
    extend = bool(getattr(mode, "is_extend", lambda: False)())
    facts = agent.facts
    if extend:
        chunked = getattr(sched, "chunked_req", None)
        if chunked is not None and any(r is chunked for r in reqs):
            facts.add("path_chunked_prefill")
        for r in reqs:
            rid = getattr(r, "rid", None)
            if rid in agent.extended:
                continue
            agent.extended.add(rid)
            if getattr(r, "prefix_len", 0) > 0:
                facts.add("path_prefix_hit")
    elif getattr(mode, "is_decode", lambda: False)() and reqs:
        facts.add("path_relay_decode")  # step N+1's input ids gathered from step N's relay entries
    info = getattr(batch, "sampling_info", None)
    orch = getattr(info, "penalizer_orchestrator", None)
    if orch is not None and getattr(orch, "is_required", False):
        facts.add("path_penalties")
    if any(getattr(r, "grammar", None) is not None for r in reqs):
        facts.add("path_grammar")


def retract(agent, orig):
    facts = agent.facts

    def retract_decode(self, *a, **kw):
        out = orig(self, *a, **kw)
        n = len(out[0]) if isinstance(out, tuple) and out and isinstance(out[0], list) else 0
        if n:
            facts.add("path_retraction", n)
            if agent.steps is not None:
                agent.steps.retracted(out[0])
        return out
    return retract_decode


def finish_in_flight(agent, orig):
    facts = agent.facts

    def _reqs_finishing_inflight(self, batch, *a, **kw):
        out = orig(self, batch, *a, **kw)
        if out:
            facts.add("path_finish_in_flight", len(out))
        return out
    return _reqs_finishing_inflight


def abort(agent, orig):
    facts = agent.facts

    def abort_request(self, recv_req, *a, **kw):
        rid = getattr(recv_req, "rid", None)
        queued = [b for b, _ in (getattr(self, "result_queue", None) or ())]

        def holds(batches):
            return bool(rid) and any(str(getattr(r, "rid", "")).startswith(rid) for b in batches
                                     if b is not None for r in (getattr(b, "reqs", None) or ()))
        if holds(queued + [getattr(self, "running_batch", None)]):
            facts.add("path_abort_running")
        if holds(queued):  # a launched step whose result is not processed yet: in flight
            facts.add("path_abort_in_flight")
        return orig(self, recv_req, *a, **kw)
    return abort_request


def reads_token_penalties(r) -> bool:
    """The request has a penalty that reads which tokens it produced (SGLang's penalizers' own
    `_is_required` tests, per request: repetition != 1, frequency != 0, presence != 0). min_new_tokens
    counts its output tokens but reads none of their ids: a token one step old changes nothing there."""
    sp = getattr(r, "sampling_params", None)
    return sp is not None and (float(getattr(sp, "repetition_penalty", 1.0) or 1.0) != 1.0
                               or float(getattr(sp, "frequency_penalty", 0.0) or 0.0) != 0.0
                               or float(getattr(sp, "presence_penalty", 0.0) or 0.0) != 0.0)


def penalty_cumulate(agent, orig):
    facts = agent.facts

    def cumulate_penalty_output_tokens(self, *a, **kw):
        # the token each request's penalties take in now is req.output_ids[-1]: one step old
        # when the previous step's token is still in flight (its result not processed yet),
        # i.e. when the request's tokens so far do not exceed what its KV already covers. The
        # orchestrator takes in a token for every request of a penalised batch, but only a request
        # with a penalty that reads token ids uses it (issue 44: a request batched with a penalised
        # one is not evidence), so only those are counted
        try:
            spec = getattr(agent, "spec", None)
            if spec is not None:
                # a drafter's batch (a step adds 1..n tokens; spec v2's host lengths are the CPU's
                # count): its books know whose latest step is still in flight (agents/sglang/spec.py)
                stale = [spec.unprocessed(r) for r in self.reqs]
            else:
                seq = [int(x) for x in self.seq_lens_cpu.tolist()]
                stale = [len(getattr(r, "origin_input_ids", ()) or ()) + len(getattr(r, "output_ids", ())) <= n
                         for r, n in zip(self.reqs, seq)]
            for r, old in zip(self.reqs, stale):
                if old and reads_token_penalties(r):
                    facts.add("penalty_stale_tokens")
                    key = client_key(r)
                    if key:
                        with facts._lock:  # the flusher serialises facts.data on its thread
                            by = facts.data.setdefault("penalty_stale_by_req", {})
                            if key in by or len(by) < 4096:
                                by[key] = by.get(key, 0) + 1
        except (AttributeError, TypeError, ValueError):
            pass
        return orig(self, *a, **kw)
    return cumulate_penalty_output_tokens


def delayed_sample(agent, orig):
    facts = agent.facts

    def launch_batch_sample_if_needed(self, batch_result, *a, **kw):
        if batch_result is not None and getattr(batch_result, "delay_sample_func", None) is not None:
            facts.add("path_delayed_sample")  # sampled after the previous token reached the grammar
        return orig(self, batch_result, *a, **kw)
    return launch_batch_sample_if_needed
