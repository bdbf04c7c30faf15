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
        self.accepted: dict = {}  # rid -> the tokens its latest step added (what the relay must carry)
        self.row_of: dict = {}  # req-pool row -> the request that last used it (the relay is indexed by it)
        self.windows: dict = {}  # rid -> (request key, [[window signature, accepted signature], ...])

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
        flat = [int(x) for x in batch.input_ids.tolist()]
        roots = flat[::n]
        reqs = batch.reqs
        facts = self.facts
        rows = [int(x) for x in batch.req_pool_indices.tolist()] if getattr(batch, "req_pool_indices", None) is not None else []
        # a request already finished or retracted when its window is built: NGRAM processes the previous
        # result after the batch was made and before its launch on a grammar batch (is_disable_overlap_for_batch:
        # need_grammar_sync), so its KV is released (kv_allocated_len 0) while it still rides this step,
        # whose result for it is thrown away (process_batch_result: finished() / is_retracted: pass)
        released = {i for i, r in enumerate(reqs) if _released(r)}
        self._relayed(worker, batch, reqs, rows, n)
        self._slots(batch, reqs, rows, lens, n, released)
        self._pending = []
        for i, req in enumerate(reqs):
            self._pending.append((req.rid, f"{lens[i]}:{_crc(flat[i * n:(i + 1) * n])}"))
            kv = req.kv
            alloc, committed = int(kv.kv_allocated_len), int(kv.kv_committed_len)
            end = lens[i] + n
            if i in released:  # no reservation left to judge it by: its slots are (_slots), its relay is
                facts.add("path_spec_window_released")
            else:
                facts.add("path_spec_reservation")
            if end > committed + one and i not in released:
                facts.add("path_spec_second_window")
            if end > alloc and i not in released:
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

    def _relayed(self, worker, batch, reqs, rows, n) -> None:
        """Overlap on: what the drafter spliced from the relay (its staged prev_token_ids /
        prev_accept_lens, NGRAM's FutureMap rows, indexed by req-pool row) must be what the request's
        previous step added, whatever row and position it has now, a row a finished request left
        included; and spliced only while that step's result is not in the request's tokens yet
        (else the drafter's context holds the run twice)."""
        facts = self.facts
        plens = list(getattr(worker, "prev_accept_lens", None) or ())
        ptoks = list(getattr(worker, "prev_token_ids", None) or ())
        use = bool(getattr(worker, "enable_overlap", False)) and len(plens) == len(reqs) and any(plens)
        for i, req in enumerate(reqs):
            if i < len(rows):
                was = self.row_of.get(rows[i])
                if was is not None and was != req.rid and req.rid not in self.windows:
                    facts.add("path_spec_relay_reuse")  # its first window, on a row another request used
                self.row_of[rows[i]] = req.rid
            want = self.accepted.get(req.rid)
            if not use or want is None:
                continue
            got = ptoks[i * n:i * n + int(plens[i])]
            facts.add("path_spec_relay_tokens")
            if got != want:
                self._violation("spec_relay_tokens_wrong", "first_spec_relay_tokens_violation",
                                f"request {req.rid} (row {i} of {len(reqs)}, req-pool row {rows[i] if i < len(rows) else '?'}): "
                                f"the drafter spliced {got} from the relay, its previous step added {want}; "
                                + self._state(req, batch))
                continue
            prev = self.last.get(req.rid)
            known = len(getattr(req, "origin_input_ids", ()) or ()) + len(getattr(req, "output_ids", ()) or ()) - 1
            if prev is None or known < prev[0] + prev[1]:
                continue
            # the previous step's result is already in the request's tokens (another batch, a prefill,
            # ran between its two decode steps): nothing may be spliced again
            facts.add("path_spec_prev_processed")
            if got:
                facts.add("spec_context_twice")
                if not facts.data.get("first_spec_context_twice"):
                    facts.set(first_spec_context_twice=f"request {req.rid} (row {i} of {len(reqs)}): {len(got)} "
                              f"token(s) {got} spliced from the relay, already among its {known + 1} tokens; "
                              + self._state(req, batch))

    def _slots(self, batch, reqs, rows, lens, n, released=frozenset()) -> None:
        """The window's KV slots (out_cache_loc, where the verify pass writes the drafts' K/V): each
        the request's own, none free in the allocator, none slot 0 (padding), none another running
        request's, none twice in the batch. A released request's (finished or retracted before the
        launch) were freed with it: only another request's slot is wrong there (on a GPU the stream
        orders this write before any reuse of a freed slot; a live request's slot it would overwrite)."""
        out = getattr(batch, "out_cache_loc", None)
        table = getattr(getattr(batch, "req_to_token_pool", None), "req_to_token", None)
        if out is None or table is None or len(rows) != len(reqs):
            return
        slots = [int(x) for x in out.tolist()]
        alloc = getattr(batch, "token_to_kv_pool_allocator", None)
        free = set()
        for name in ("free_pages", "release_pages"):
            t = getattr(alloc, name, None)
            if t is not None:
                free.update(int(x) for x in t.tolist())
        owner = {}
        for j, r in enumerate(reqs):
            for x in table[rows[j], :int(r.kv.kv_allocated_len)].tolist():
                owner.setdefault(int(x), j)
        seen = set()
        for i, req in enumerate(reqs):
            mine = slots[i * n:(i + 1) * n]
            self.facts.add("path_spec_window_slots")
            bad = [(x, "slot 0" if x == 0 else "free" if x in free else "twice in the batch" if x in seen
                    else f"row {owner[x]}'s" if owner.get(x, i) != i else "not reserved" if x not in owner else "")
                   for x in mine]
            bad = [b for b in bad if b[1] and (i not in released or b[1].startswith("row") or b[1] == "twice in the batch")]
            seen.update(mine)
            if bad:
                self._violation("spec_window_slots_wrong", "first_spec_window_slots_violation",
                                f"request {req.rid} (row {i} of {len(reqs)}): window [{lens[i]}, {lens[i] + n}) "
                                f"writes its drafts' K/V to slots {mine}: " + ", ".join(f"{x} {w}" for x, w in bad[:4])
                                + "; " + self._state(req, batch))

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
            if i < len(lens):
                self.accepted[req.rid] = ids[i * stride:i * stride + lens[i]] if verify else [ids[i]]
        if verify:  # each window: its signature (start, drafts) and what it accepted, per request key
            pending = dict(getattr(self, "_pending", ()) or ())
            for i, req in enumerate(reqs):
                sig = pending.get(req.rid)
                if sig is None or i >= len(lens):
                    continue
                rec = self.windows.get(req.rid)
                if rec is None:
                    if len(self.windows) >= MAX_WINDOW_REQS:
                        self.windows.pop(next(iter(self.windows)))
                    rec = self.windows[req.rid] = (_key(req), [])
                rec[1].append([sig, [lens[i], _crc(self.accepted[req.rid])]])
            self._pending = []
            with facts._lock:  # the flusher serialises facts.data on its thread
                facts.data["spec_windows"] = {r: [k, list(w)] for r, (k, w) in self.windows.items()}
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

    def unprocessed(self, req) -> bool:
        """Whether the request's latest step (the length it published) is not in its tokens yet:
        its result not processed (overlap on, the step in flight)."""
        prev = self.last.get(req.rid)
        known = len(getattr(req, "origin_input_ids", ()) or ()) + len(getattr(req, "output_ids", ()) or ()) - 1
        return prev is not None and known < prev[0] + prev[1]

    def forget(self, rids) -> None:
        for r in rids:
            self.newest.pop(r, None)
            self.last.pop(r, None)


MAX_WINDOW_REQS = 256  # the requests whose windows are kept (the newest): the run's, not the server's life


def _released(req) -> bool:
    """Finished (its result processed) or retracted, while still a row of the batch being launched."""
    fin = getattr(req, "finished", None)
    return bool(getattr(req, "is_retracted", False) or (callable(fin) and fin()))


def _crc(ids) -> str:
    import zlib
    return f"{zlib.crc32(','.join(str(int(x)) for x in ids).encode()):08x}"


def _key(req) -> str:
    from harness.agents.sglang.steps import client_key
    return client_key(req)


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
            except (AttributeError, TypeError, ValueError, RuntimeError, IndexError, KeyError) as e:
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
            except (AttributeError, TypeError, ValueError, RuntimeError, IndexError, KeyError) as e:
                agent.facts.set(spec_verify_unread=str(e)[:200])
            return result
        return forward_batch_generation

    wrap("_prepare_for_speculative_decoding", window)
    wrap("forward_batch_generation", verify)
    return books
