"""Speculative decoding in SGLang's spec-v2 loop, counted and judged from inside the scheduler
(the article's sections 3-6: the window, the relay, the bonus token, the two reserved windows).

Installed by the agent when the scheduler runs a drafter (server_args.speculative_algorithm); it
wraps the drafter's worker (NGRAM: sglang.srt.speculative.ngram_worker.NGRAMWorker):

- `_prepare_for_speculative_decoding` (point `spec_window`): the step's window is built, from the
  length the relay carried (batch.seq_lens, the GPU's count) and the slots the CPU reserved before
  the step (req.kv.kv_allocated_len). Judged per request:
  * reservation: the window [seq_len, seq_len + n) lies inside the reservation (none written past
    it: `spec_past_reservation`, the first described); counted: windows checked
    (`path_spec_reservation`), windows that reached into the second reserved window
    (`path_spec_second_window`: the CPU's count a step behind, the case the second window exists for);
  * bonus token: the window's first token is the last token the previous step accepted for that
    request (its bonus token), whatever the batch's order and size (`spec_bonus_wrong`, the first
    described); counted: `path_spec_bonus` (windows checked), `path_spec_bonus_batched` (of them,
    rows past the first of a batch of several: where a stride error shows).
- `forward_batch_generation` (point `spec_verify`): accepted lengths per verify step:
  `spec_verify_steps`, `spec_drafts_proposed`, `spec_drafts_accepted`, `spec_accept_hist`
  {accept length: requests}, `path_spec_accepted` / `path_spec_rejected` (requests of a verify step
  with at least one draft accepted / rejected), `spec_batched_verify_steps` (steps of several
  requests), and each request's newest token (the next window's expected bonus token).
"""
from __future__ import annotations

SPEC_WORKERS = {"NGRAM": ("sglang.srt.speculative.ngram_worker", "NGRAMWorker")}


def spec_algorithm_of_process() -> str | None:
    """The drafter this scheduler process runs (server_args of run_scheduler_process), or None."""
    import sys
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "run_scheduler_process":
            args = f.f_locals.get("server_args")
            algo = getattr(args, "speculative_algorithm", None)
            return str(algo).upper() if algo else None
        f = f.f_back
    return None


class SpecBooks:
    def __init__(self, facts, window_len=None):
        self.facts = facts
        self.window_len = window_len  # one window of the reservation; None: SGLang's own sizing, read per step
        self.newest: dict = {}  # rid -> the last token its latest step produced (the next window's bonus)
        # rid -> (the length its latest step started from, tokens it added, "prefill"/"verify"): the
        # length the relay must carry to the request's next window
        self.last: dict = {}

    def _violation(self, key: str, first: str, line: str) -> None:
        self.facts.add(key)
        if not self.facts.data.get(first):
            self.facts.set(**{first: line[:600]})
        seen = list(self.facts.data.get("spec_violations") or [])
        if len(seen) < 12:  # a few more than the first, said in full: what the diagnosis reads
            self.facts.set(spec_violations=seen + [f"{key}: {line[:600]}"])

    def _state(self, req, batch) -> str:
        """What the scheduler knew of a request when its window was judged (said with a violation)."""
        fin = req.finished() if callable(getattr(req, "finished", None)) else None
        sync = batch.grammar_needs_sync() if callable(getattr(batch, "grammar_needs_sync", None)) else None
        return (f"prompt {len(getattr(req, 'origin_input_ids', ()) or ())}, output {len(getattr(req, 'output_ids', ()) or ())}, "
                f"retracted {getattr(req, 'is_retracted', None)} (x{getattr(req, 'retraction_count', 0)}), finished {fin}, "
                f"grammar {getattr(req, 'grammar', None) is not None}, decode_batch_idx {getattr(req, 'decode_batch_idx', None)}, "
                f"batch grammar sync {sync}, its last step {self.last.get(req.rid)}")

    def window(self, worker, batch) -> None:
        """After the window is built (forward_mode TARGET_VERIFY): reservation and bonus token."""
        fm = getattr(batch, "forward_mode", None)
        if fm is None or not fm.is_target_verify():
            return
        n = int(worker.draft_token_num)
        one = self.window_len
        if one is None:
            from sglang.srt.mem_cache.allocation_sizing import get_alloc_len_per_decode
            one = int(get_alloc_len_per_decode())
        lens = [int(x) for x in batch.seq_lens.tolist()]
        roots = [int(x) for x in batch.input_ids.tolist()[::n]]
        reqs = batch.reqs
        facts = self.facts
        for i, req in enumerate(reqs):
            kv = req.kv
            alloc, committed = int(kv.kv_allocated_len), int(kv.kv_committed_len)
            end = lens[i] + n
            facts.add("path_spec_reservation")
            if end > committed + one:
                facts.add("path_spec_second_window")
            if end > alloc:
                self._violation("spec_past_reservation", "first_spec_reservation_violation",
                                f"request {req.rid} (row {i} of {len(reqs)}): window [{lens[i]}, {end}) past its "
                                f"reservation of {alloc} slots (CPU count {committed}, one window {one}); "
                                + self._state(req, batch))
            prev = self.last.get(req.rid)
            if prev is not None:  # the relay: the length the request's previous step published
                facts.add("path_spec_relay_len")
                if prev[0] + prev[1] != lens[i]:
                    self._violation("spec_relay_len_wrong", "first_spec_relay_len_violation",
                                    f"request {req.rid} (row {i} of {len(reqs)}): window starts at {lens[i]}, its "
                                    f"{prev[2]} step started at {prev[0]} and added {prev[1]}; " + self._state(req, batch))
            want = self.newest.get(req.rid)
            if want is None:
                continue
            facts.add("path_spec_bonus")
            if len(reqs) > 1 and i > 0:
                facts.add("path_spec_bonus_batched")
            if roots[i] != want:
                self._violation("spec_bonus_wrong", "first_spec_bonus_violation",
                                f"request {req.rid} (row {i} of {len(reqs)}): window starts with token {roots[i]}, "
                                f"its last accepted token was {want}")

    def verified(self, worker, batch, result, verify: bool) -> None:
        """After a step of the drafter's worker (verify: a decode step, its window verified; else a
        prefill, one token a request): accepted lengths, and each request's newest token."""
        facts = self.facts
        reqs = batch.reqs
        if not reqs:
            return
        n = int(worker.draft_token_num)
        lens = [int(x) for x in result.accept_lens.tolist()]
        ids = [int(x) for x in result.next_token_ids.tolist()]
        stride = len(ids) // len(reqs) if verify else 1
        seqs = [int(x) for x in batch.seq_lens.tolist()] if getattr(batch, "seq_lens", None) is not None else []
        for i, req in enumerate(reqs):
            if i < len(lens) and lens[i] >= 1:
                self.newest[req.rid] = ids[i * stride + lens[i] - 1]
            if i < len(seqs):  # a prefill publishes its own length (the first token's KV is the next step's)
                self.last[req.rid] = (seqs[i], lens[i] if verify else 0, "verify" if verify else "prefill")
        if not verify:
            return
        facts.add("spec_verify_steps")
        if len(reqs) > 1:
            facts.add("spec_batched_verify_steps")
        hist = dict(facts.data.get("spec_accept_hist") or {})
        for a in lens:
            hist[str(a)] = hist.get(str(a), 0) + 1
            facts.add("spec_drafts_proposed", n - 1)
            facts.add("spec_drafts_accepted", a - 1)
            if a > 1:
                facts.add("path_spec_accepted")
            if a < n:
                facts.add("path_spec_rejected")
        facts.set(spec_accept_hist=hist, spec_window=n)

    def forget(self, rids) -> None:
        for r in rids:
            self.newest.pop(r, None)
            self.last.pop(r, None)


def install(agent, algorithm: str) -> SpecBooks | None:
    """Wrap the drafter's worker of `algorithm` (None where the agent does not know it: not counted)."""
    where = SPEC_WORKERS.get(algorithm)
    agent.facts.set(spec_algorithm=algorithm)
    if where is None:
        agent.facts.set(spec_not_counted=f"no speculative counters for {algorithm}")
        return None
    mod = agent.resolve(where[0])
    cls = getattr(mod, where[1])
    books = SpecBooks(agent.facts)

    def wrap(attr, make):
        orig = cls.__dict__[attr]
        agent.originals[f"spec:{attr}"] = (cls, attr, orig)
        setattr(cls, attr, make(orig))

    def window(orig):
        def _prepare_for_speculative_decoding(self, batch, *a, **kw):
            out = orig(self, batch, *a, **kw)
            try:
                books.window(self, batch)
            except (AttributeError, TypeError, ValueError, RuntimeError) as e:
                agent.facts.set(spec_window_unread=str(e)[:200])
            return out
        return _prepare_for_speculative_decoding

    def verify(orig):
        def forward_batch_generation(self, batch, *a, **kw):
            fm = getattr(batch, "forward_mode", None)
            decode = bool(fm is not None and fm.is_decode())  # a decode batch becomes a verify pass
            result = orig(self, batch, *a, **kw)
            try:
                books.verified(self, batch, result, decode)
            except (AttributeError, TypeError, ValueError, RuntimeError) as e:
                agent.facts.set(spec_verify_unread=str(e)[:200])
            return result
        return forward_batch_generation

    wrap("_prepare_for_speculative_decoding", window)
    wrap("forward_batch_generation", verify)
    return books
