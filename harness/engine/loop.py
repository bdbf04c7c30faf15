"""The serving loops: the normal loop and the overlap loop, on three streams.

- schedule stream: the scheduler's small GPU ops (slot-table writes, batch inputs);
- forward stream: the step's passes;
- copy stream: the step's tokens to a pinned host buffer.

After launching a step, the schedule stream waits on the event the step records
right after its last read of the shared tables (the fence), so everything the
scheduler queues for the next step runs behind those reads.
"""
from __future__ import annotations

from collections import deque

import torch

from harness.device.stream import Device, Event
from harness.engine.books import Books, held
from harness.engine.config import EngineConfig, ModelConfig
from harness.engine.memory import KVPool, PrefixCache, Rows
from harness.engine.model import Model, pad_rows
from harness.engine.relay import Relay
from harness.engine.request import Request, State
from harness.engine.sampling import sample
from harness.engine.scheduler import Batch, Scheduler

# step inputs and outputs are double-buffered: step N+1 is prepared while step N runs.
# Conservation: each launched step holds host slot `ring % RING` (its pinned token and logprob
# buffers) until it is processed, so the steps in flight hold distinct slots, at most RING of
# them, and none at idle (harness/engine/books.py checks it after every step)
RING = 2
ACCOUNTING_WINDOW = 4096  # steps of pool accounting kept (engine.accounting_log)
TOP_K = 5  # log-probabilities returned per position: the chosen token's and the top 5
# The watchdog's clock: rounds of the loop in a row with no token delivered and no request
# admitted. A correct engine spends at most a few (a finished request's discarded extra step);
# a leak that starves admission spends every round from then on, each one cheap.
STALL_ROUNDS = 64


class EngineHang(RuntimeError):
    """The engine stopped making progress with work left (a leak starved admission, say): the
    ref engine's HANG, with what is held and by whom."""

    def __init__(self, message: str, engine=None):
        super().__init__(message)
        self.engine = engine  # its books, for a caller that reports where the leak began


class Engine:
    def __init__(self, cfg: EngineConfig, mcfg: ModelConfig, model: Model, dev: Device, detok=None):
        self.cfg, self.mcfg, self.model, self.dev = cfg, mcfg, model, dev
        self.L = cfg.max_context or mcfg.max_context
        n, maxb = cfg.max_running, pad_rows(cfg.max_running)
        self.maxb = maxb
        self.max_tokens = pad_rows(max(cfg.max_prefill_tokens, maxb))
        self.schedule = dev.stream("schedule")
        self.forward = dev.stream("forward")
        self.copy = dev.stream("copy")
        if "unfenced_row_reuse" in cfg.faults:
            self.admit = dev.stream("admit")  # the defect: a second scheduler stream outside the fence
        # shared tables (written by the schedule stream, read by the forward stream)
        self.req_to_token = dev.alloc("req_to_token", (n + 1, self.L), torch.int64)  # [rows + 1, max_context]
        self.relay = Relay(dev, n)
        self.kv_k = [dev.alloc(f"kv[{i}].k", (cfg.pool_slots, mcfg.kv_heads, mcfg.head_dim)) for i in range(mcfg.layers)]
        self.kv_v = [dev.alloc(f"kv[{i}].v", (cfg.pool_slots, mcfg.kv_heads, mcfg.head_dim)) for i in range(mcfg.layers)]
        # step inputs, written by the schedule stream (ring of RING)
        ring = 1 if "single_input_buffer" in cfg.faults else RING
        self.ring = ring
        self.b_tokens = [dev.alloc(f"batch[{s}].input_ids", (self.max_tokens,), torch.int64) for s in range(ring)]
        self.b_pos = [dev.alloc(f"batch[{s}].positions", (self.max_tokens,), torch.int64) for s in range(ring)]
        self.b_rows = [dev.alloc(f"batch[{s}].rows", (maxb,), torch.int64) for s in range(ring)]
        self.b_entries = [dev.alloc(f"batch[{s}].entries", (maxb,), torch.int64) for s in range(ring)]
        # [temperature, top_p, unused, repetition penalty] per row; seeds apart, as int64 (a float
        # would round seeds above 2**24 together)
        self.b_samp = [dev.alloc(f"batch[{s}].sampling", (4, maxb)) for s in range(ring)]
        self.b_seed = [dev.alloc(f"batch[{s}].seeds", (maxb,), torch.int64) for s in range(ring)]
        self.b_last = [dev.alloc(f"batch[{s}].last", (maxb,), torch.int64) for s in range(ring)]  # sampled row
        # forward-stream scratch
        self.f_ids = dev.alloc("fwd.input_ids", (self.max_tokens,), torch.int64)
        self.f_kvidx = dev.alloc("fwd.kv_indices", (maxb, self.L), torch.int64)  # [batch, max_context]
        self.f_loc = dev.alloc("fwd.out_loc", (self.max_tokens,), torch.int64)
        self.f_logits = dev.alloc("fwd.logits", (maxb, mcfg.vocab_size))
        self.f_last_pos = dev.alloc("fwd.sample_pos", (maxb,), torch.int64)
        # every token at every position of each row, kept on the device so the repetition
        # penalty sees the newest token even when the CPU's view is one step old
        self.history = dev.alloc("token_history", (n + 1, self.L), torch.int64)  # [rows + 1, max_context]
        # step outputs: device buffer and pinned host buffer, ring of RING
        self.o_tokens = [dev.alloc(f"out[{s}].tokens", (maxb,), torch.int64) for s in range(RING)]
        self.h_tokens = [dev.pinned(f"host[{s}].tokens", (maxb,), torch.int64) for s in range(RING)]
        # [chosen logprob, top-K logprobs, top-K ids] per row, as float32
        self.o_lp = [dev.alloc(f"out[{s}].logprobs", (maxb, 1 + 2 * TOP_K)) for s in range(RING)]
        self.h_lp = [dev.pinned(f"host[{s}].logprobs", (maxb, 1 + 2 * TOP_K)) for s in range(RING)]
        if "reused_host_buffer" in cfg.faults:
            self.h_stage = dev.pinned("host.staging.sampling", (4, maxb))  # [4, batch], one for every step
        self.listener = None  # called with each request that got a token (or finished), for streaming

        self.pool = KVPool(cfg.pool_slots, cfg.page_size)
        self.cache = PrefixCache(self.pool, cfg.prefix_cache, lookahead=1 if cfg.spec == "mtp" else 0,
                                 faults=cfg.faults)
        window = cfg.spec_k + 1 if cfg.spec else 1
        first = 0 if "live_entry_zero" in cfg.faults else 1  # the defect: row / entry 0 handed to a request
        if first == 0:
            self.relay.entries = Rows(n, first)
        self.sched = Scheduler(cfg, mcfg, self.pool, Rows(n, first), self.relay.entries, self.cache, detok, window)
        self.spec = None
        if cfg.spec:
            from harness.engine.spec import SpecDecoder
            self.spec = SpecDecoder(self)
        self.steps = 0
        self.iteration = 0
        self.host_ring = RING
        self.books = Books(self)  # conservation after every processed step and at idle
        self.progress = 0  # tokens delivered + requests admitted: the watchdog's measure
        self.stalled = 0  # rounds in a row without progress
        self.queue: deque[Batch] = deque()  # launched, not yet processed (at most 2 under overlap)
        # (free, cached, in use, total) after each processed step: a window, so a long-lived
        # server does not keep one entry per step forever
        self.accounting_log: deque[tuple[int, int, int, int]] = deque(maxlen=ACCOUNTING_WINDOW)

    # -- validation -----------------------------------------------------------------
    def check_fits(self, r: Request) -> str | None:
        """Why a request can never run here, or None."""
        # a finished request's extra step may run a window past a count that already overshot by one
        need_pos = len(r.prompt_ids) + r.max_new_tokens + 3 * self.sched.window + 1
        if need_pos > self.L:
            return (f"request {r.rid}: prompt of {len(r.prompt_ids)} tokens + {r.max_new_tokens} new tokens "
                    f"does not fit a row of {self.L} positions (--max-context)")
        ps = self.pool.page_size
        if -(-need_pos // ps) > self.pool.total:
            return (f"request {r.rid}: needs {need_pos} KV slots but the pool holds "
                    f"{self.pool.total * ps} (--pool-slots)")
        if len(r.prompt_ids) > self.cfg.max_prefill_tokens:
            return f"request {r.rid}: prompt of {len(r.prompt_ids)} tokens exceeds --max-prefill-tokens"
        if not r.prompt_ids:
            return f"request {r.rid}: empty prompt"
        if self.spec is not None and r.repetition_penalty != 1.0:
            return f"request {r.rid}: the repetition penalty is not supported with speculative decoding"
        return None

    # -- the loops --------------------------------------------------------------------
    def run(self, requests: list[Request], on_step=None) -> list[Request]:
        """Run a workload to completion; requests join at their `arrival` iteration."""
        for r in requests:
            why = self.check_fits(r)
            if why:
                raise ValueError(why)
        pending = sorted(requests, key=lambda r: r.arrival)
        while pending or self.has_work():
            while pending and pending[0].arrival <= self.iteration:
                self.sched.add(pending.pop(0))
            if not self.has_work():
                self.iteration = pending[0].arrival  # nothing to do until the next arrival
                continue
            self.step()
            if on_step is not None:
                on_step(self)
        self.dev.finish()
        self.books.at_idle()
        return requests

    def submit(self, r: Request) -> None:
        """Online use (the server): queue a request; the next step() may admit it."""
        why = self.check_fits(r)
        if why:
            raise ValueError(why)
        self.sched.add(r)

    def has_work(self) -> bool:
        return bool(self.queue) or not self.sched.idle

    def step(self) -> None:
        """One round of the loop: prepare and launch step N+1, then process step N (overlap),
        or prepare, launch and process one step (no overlap)."""
        before = self.progress
        if self.spec is not None and self.spec.algo == "ngram" and "ngram_no_wait" not in self.cfg.faults:
            while self.queue:  # NGRAM's lookup needs the accepted tokens: the host waits for the step
                self._process(self.queue.popleft())
        batch = self._prepare()
        if batch is not None:
            if "wait_before_issue" in self.cfg.faults:  # the defect: step N's result before N+1 is issued
                for q in self.queue:
                    q.done.synchronize()
            self._launch(batch)
            if not self.cfg.overlap:
                self._process(batch)
            else:
                self.queue.append(batch)
        # overlap: process step N only after step N+1 is in the queue
        if self.queue and (len(self.queue) > 1 or batch is None):
            self._process(self.queue.popleft())
        self.iteration += 1
        self._watchdog(before)

    def _watchdog(self, before: int) -> None:
        """HANG when STALL_ROUNDS rounds in a row delivered no token and admitted no request."""
        if self.progress != before or not self.has_work():
            self.stalled = 0
            return
        self.stalled += 1
        if self.stalled >= STALL_ROUNDS:
            self.books.at_hang()  # where the starving leak began, when no per-step count showed it
            s = self.sched
            names = ", ".join(r.rid for r in list(s.waiting)[:4]) + (" ..." if len(s.waiting) > 4 else "")
            raise EngineHang(
                f"HANG: the ref engine made no progress in {self.stalled} rounds of its loop (no token delivered, "
                f"no request admitted) after step {max(self.steps - 1, 0)}: {len(s.waiting)} waiting"
                + (f" ({names})" if names else "") + f", {len(s.running)} running, {len(self.queue)} step(s) in "
                f"flight; held: {held(self)}", self)

    def abort(self, r: Request) -> None:
        self.sched.abort(r)
        if r.finished and self.listener is not None:
            self.listener(r)

    # -- prepare: CPU picks the batch and queues its table writes --------------------------
    def _prepare(self) -> Batch | None:
        c = self.cfg.costs
        self.dev.set_step(self.steps)
        with self.dev.host_phase("prepare", c.prepare_ms):
            batch = self.sched.next_batch(self.steps)
            if batch is not None:
                batch.ring = self.steps % self.ring
                if batch.kind == "prefill":
                    self.progress += batch.size
                if self.spec is not None and self.spec.algo == "ngram" and batch.kind == "decode":
                    self.dev._host_advance(c.ngram_lookup_ms * batch.size)  # one lookup per request
            self._flush_row_writes()
            if batch is not None:
                self._write_inputs(batch)
        return batch

    def _flush_row_writes(self) -> None:
        writes, self.sched.row_writes = self.sched.row_writes, []
        if not writes:
            return
        rows = [(row, start, self.dev.from_host(slots)) for row, start, slots, _ in writes]
        rows = [(row, start, t, start + t.numel()) for row, start, t in rows]  # the ends, here on the host
        table = self.req_to_token

        def write():
            for row, start, slots, end in rows:
                table[row, start:end].copy_(slots, non_blocking=True)

        meta = {"rows": {row: rid for row, _, _, rid in writes}}
        stream = self.schedule
        if "unfenced_row_reuse" in self.cfg.faults and any(start == 0 for _, start, _, _ in writes):
            stream = self.admit
        stream.launch("req_to_token.write", write, cost=self.cfg.costs.sched_op_ms, meta=meta)
        if "blocking_copy" in self.cfg.faults:
            # a blocking .to() on the schedule stream: the host waits behind the fence
            self.schedule.synchronize()

    def _write_inputs(self, b: Batch) -> None:
        s = b.ring
        host = self.dev.from_host
        ids = host([t for seq in b.input_ids for t in seq] or [0])
        pos = host([p for ps in b.positions for p in ps])
        rows = host(b.rows)
        entries = host(b.entries)
        samp = host([b.temperature, b.top_p, [0.0] * b.size, b.penalty], torch.float32)
        if "reused_host_buffer" in self.cfg.faults:
            # the defect: one pinned staging buffer reused every step; the host rewrites it for
            # step N+1 while step N's non-blocking copy from it may still be queued (behind the fence)
            stage = self.h_stage[:, :b.size]
            self.dev.host_access("host.staging.sampling", stage, write=True)
            stage.copy_(samp)
            samp = stage
        seeds = host(b.seeds)
        last = host([sum(len(p) for p in b.positions[:i + 1]) - 1 for i in range(b.size)])
        dst = (self.b_tokens[s], self.b_pos[s], self.b_rows[s], self.b_entries[s], self.b_samp[s], self.b_last[s],
               self.b_seed[s])

        def h2d():
            dst[0][:ids.numel()].copy_(ids, non_blocking=True)
            dst[1][:pos.numel()].copy_(pos, non_blocking=True)
            dst[2][:rows.numel()].copy_(rows, non_blocking=True)
            dst[3][:entries.numel()].copy_(entries, non_blocking=True)
            dst[4][:, :rows.numel()].copy_(samp, non_blocking=True)
            dst[5][:last.numel()].copy_(last, non_blocking=True)
            dst[6][:seeds.numel()].copy_(seeds, non_blocking=True)

        if self.spec is not None and self.spec.algo == "ngram" and b.kind == "decode":
            drafts, dd = host(self.spec.drafts_for(b)), self.spec.b_drafts[s]
            self.schedule.launch("drafts.h2d", lambda: dd[:drafts.shape[0]].copy_(drafts, non_blocking=True),
                                 cost=self.cfg.costs.sched_op_ms)
        self.schedule.launch("batch.h2d", h2d, cost=self.cfg.costs.sched_op_ms)

    # -- launch: queue the step's device work --------------------------------------------
    def _launch(self, b: Batch) -> None:
        dev, fwd, faults = self.dev, self.forward, self.cfg.faults
        if b.kind == "prefill":
            b.history_ids = [dev.from_host(r.seq_at_admit) for r in b.reqs]
        spec_step = self.spec is not None and b.kind == "decode"
        with dev.host_phase("launch", 0.0):
            fwd.wait_stream(self.schedule)  # the step starts after whatever the scheduler queued
            if "unfenced_row_reuse" in faults:
                fwd.wait_stream(self.admit)
            rids = [r.rid for r in b.reqs]
            meta = {"rows": dict(zip(b.rows, rids)), "entries": dict(zip(b.entries, rids)), "kind": b.kind,
                    "padded": pad_rows(b.size) > b.size}
            if dev.tracker is not None:
                meta["plan"] = self._ownership_plan(b)
            fence_ev = self.spec.queue_passes(b, meta) if spec_step else self._queue_passes(b, meta)
            step_done = fwd.record("step_done")
            if "copy_no_wait" not in faults:
                self.copy.wait_event(step_done)
            if spec_step:
                b.done = self.spec.queue_copies(b)
            else:
                r = b.ring % RING
                self.copy.launch("logprobs.d2h", lambda: self.h_lp[r].copy_(self.o_lp[r], non_blocking=True),
                                 kind="copy")
                b.done = self.copy.copy_to_host("tokens.d2h", self.o_tokens[r], self.h_tokens[r],
                                                cost=self.cfg.costs.copy_ms)
            b.fence_event = fence_ev
            # the fence: the scheduler's later writes run behind this step's table reads
            if "no_fence" not in faults:
                if "fence_wait_forward" in faults:
                    self.schedule.wait_stream(fwd)
                else:
                    self.schedule.wait_event(fence_ev)
            if spec_step:
                self.spec.after_fence(b)
        self.steps += 1

    def _ownership_plan(self, b: Batch) -> dict:
        """What each row of the step owns as planned (its pages, taken now, before the CPU can free
        them), for the device-side slot-ownership check (harness/hazards/ownership.py)."""
        running = self.sched.running
        return {"page_size": self.pool.page_size, "pages": [frozenset(r.pages) for r in b.reqs],
                "ntok": [len(ps) for ps in b.positions],
                "owners": {p: r.rid for r in running for p in r.pages[r.n_cached_pages:]}}

    def _queue_passes(self, b: Batch, meta: dict):
        """A prefill or plain decode step on the forward stream; returns the fence event."""
        c, fwd, faults = self.cfg.costs, self.forward, self.cfg.faults
        if "fence_before_read" in faults:
            fence_ev = fwd.record("shared_read_done")
            fwd.launch("attn_metadata", lambda: self._attn_metadata(b), meta=meta)
        else:
            fwd.launch("attn_metadata", lambda: self._attn_metadata(b), meta=meta)
            fence_ev = fwd.record("shared_read_done")  # right after the last read of the shared tables
        cost = c.decode_ms if b.kind == "decode" else c.prefill_ms_per_token * b.n_tokens
        fwd.launch(f"{b.kind}.forward", lambda: self._forward(b), cost=cost, meta=meta)
        fwd.launch("sample", lambda: self._sample(b), meta=meta)
        if self.spec is not None and self.spec.algo == "mtp":  # the draft head over the prompt
            fwd.launch("draft_extend", lambda: self.spec.prefill_extend(b), cost=c.extend_ms, meta=meta)
        return fence_ev

    # device side: each of these runs as one op on the forward stream ------------------------
    def _attn_metadata(self, b: Batch) -> None:
        """Read the shared tables: input tokens from the relay, slots from req_to_token.
        Row numbers and lengths are the CPU's (plain decoding knows them), so this issues
        no host sync on a real GPU and touches exactly the positions it needs."""
        s, n, B = b.ring, b.n_tokens, b.size
        if b.kind == "decode":
            self.relay.read_tokens(self.b_entries[s][:B], self.f_ids[:B])
        else:
            self.f_ids[:n] = self.b_tokens[s][:n]
        self.f_kvidx.zero_()
        start = 0
        for g, (row, ps) in enumerate(zip(b.rows, b.positions)):
            last = ps[-1]
            self.f_kvidx[g, :last + 1] = self.req_to_token[row, :last + 1]  # [last + 1] slots of the row
            self.f_loc[start:start + len(ps)] = self.f_kvidx[g, ps[0]:last + 1]
            self.f_last_pos[g] = last
            start += len(ps)

    def _groups(self, b: Batch) -> list[tuple[int, int]]:
        out, start = [], 0
        for ps in b.positions:
            out.append((start, len(ps)))
            start += len(ps)
        return out

    def _forward(self, b: Batch) -> None:
        s, n, B = b.ring, b.n_tokens, b.size
        N = pad_rows(n)
        groups = self._groups(b)
        ids, pos, loc = self.f_ids[:N].clone(), self.b_pos[s][:N].clone(), self.f_loc[:N].clone()
        if N > n:  # padded rows: token 0 at position 0 into the padding slot 0
            ids[n:], pos[n:], loc[n:] = 0, 0, 0
        kv_len = [ps[-1] + 1 for ps in b.positions]  # the CPU knows each row's length: no device read
        if b.kind == "decode":
            groups = groups + [(i, 1) for i in range(n, N)]
            kv_len += [1] * (N - n)
            kvidx = self.f_kvidx[:N]
        else:
            kvidx = self.f_kvidx[:B]
        hidden = self.model.forward(ids, pos, loc, groups, kvidx, self.kv_k, self.kv_v, kv_len)
        if self.spec is not None and self.spec.algo == "mtp":
            self.spec.f_phid[:N] = hidden
        M = pad_rows(B)
        last = self.b_last[s][:B]
        if "packed_prefill_slip" in self.cfg.faults and b.kind == "prefill":
            last = last.roll(1)  # the defect: each packed request samples from its neighbour's last token
        h = hidden[last]  # each request's last token
        if M > B:
            h = torch.cat([h, h.new_zeros(M - B, h.shape[1])])
        self.f_logits[:M] = self.model.logits(h)

    def _penalize(self, b: Batch, logits: torch.Tensor) -> torch.Tensor:
        """Repetition penalty over each row's tokens so far (HF semantics), from the device history."""
        s, B = b.ring, b.size
        if b.kind == "prefill":  # the whole sequence, prefix-cache hits included
            for row, seq in zip(b.rows, b.history_ids):
                self.history[row, :seq.numel()].copy_(seq, non_blocking=True)
        else:
            for g, (row, ps) in enumerate(zip(b.rows, b.positions)):
                self.history[row, ps[0]] = self.f_ids[g]  # this step's input token
        if all(p == 1.0 for p in b.penalty):
            return logits
        seen = torch.zeros_like(logits, dtype=torch.bool)  # [B, vocab]
        for g, (row, ps, pen) in enumerate(zip(b.rows, b.positions, b.penalty)):
            if pen == 1.0:
                continue
            if "penalty_from_cpu" in self.cfg.faults:  # the CPU's tokens miss the newest one
                toks = self.dev.from_host(b.cpu_tokens[g] or [0]).to(logits.device, non_blocking=True)
            else:
                toks = self.history[row, :ps[-1] + 1]
            seen[g].index_fill_(0, toks, True)
        pen = self.b_samp[s][3, :B][:, None]
        hit = torch.where(logits > 0, logits / pen, logits * pen)
        return torch.where(seen, hit, logits)

    def _sample(self, b: Batch) -> None:
        s, B = b.ring, b.size
        samp = self.b_samp[s][:, :B]
        logits = self._penalize(b, self.f_logits[:B])
        toks = sample(logits, samp[0], samp[1], self.b_seed[s][:B], self.f_last_pos[:B] + 1,
                      any_sampled=any(t > 0 for t in b.temperature))
        # padded rows (as a CUDA graph replays them) publish into entry 0, which no request owns
        M = pad_rows(B)
        entries = self.b_entries[s][:M].clone()
        entries[B:] = entries[0] if "pad_live_entry" in self.cfg.faults else 0
        padded = torch.cat([toks, toks.new_zeros(M - B)]) if M > B else toks
        lens = self.f_last_pos[:M] + 1  # speculative: the first window starts after the prompt
        lens[B:] = 0
        if b.kind == "prefill" and "skip_prefill_publish" in self.cfg.faults:
            entries, padded, lens = entries[B:], padded[B:], lens[B:]
        self.relay.publish_tokens(entries, padded)
        if self.spec is not None:
            self.relay.seq_lens.index_copy_(0, entries, lens)
        self.o_tokens[b.ring % RING][:B] = toks
        lp = torch.log_softmax(logits, dim=-1)  # [B, vocab]
        top = torch.topk(lp, TOP_K, dim=-1)
        out = self.o_lp[b.ring % RING]
        out[:B, 0] = lp.gather(1, toks[:, None])[:, 0]
        out[:B, 1:1 + TOP_K] = top.values
        out[:B, 1 + TOP_K:] = top.indices.to(torch.float32)

    # -- process: one step old under overlap ------------------------------------------------
    def _process(self, b: Batch) -> None:
        c, dev = self.cfg.costs, self.dev
        if "early_process" not in self.cfg.faults:
            b.done.synchronize()
        if self.spec is not None and b.kind == "decode":
            with dev.host_phase("process", c.process_ms):
                toks, acc, lens = self.spec.results(b)
                updated = self.sched.process_spec(b, toks, acc, lens, self.spec)
                self._flush_row_writes()
                self._notify(b, updated)
            self._processed(b, updated)
            return
        with dev.host_phase("process", c.process_ms):
            host = self.h_tokens[b.ring % RING]
            dev.host_access(f"host[{b.ring % RING}].tokens", host[:b.size])
            toks = host[:b.size].tolist()
            slot = b.ring % RING
            if "stale_logprobs" in self.cfg.faults:  # the defect: the other step's pinned records
                slot = (slot + 1) % RING
            lp = self.h_lp[slot]
            dev.host_access(f"host[{slot}].logprobs", lp[:b.size])
            updated = self.sched.process(b, toks, lp[:b.size].tolist())
            self._flush_row_writes()
            self._notify(b, updated)
        self._processed(b, updated)

    def _processed(self, b: Batch, updated: list[Request]) -> None:
        self.progress += len(updated)
        self.accounting_log.append(self.sched.accounting())
        self.books.after_process(b)

    def _notify(self, b: Batch, updated: list[Request]) -> None:
        if self.spec is not None and self.spec.index is not None:
            for r in updated:  # NGRAM's index learns what the server produced
                self.spec.index.add((r.prompt_ids + r.output_ids)[-(self.spec.k + 8):], self.spec.k)
        for r in b.reqs:
            if r.state is State.FINISHED and not r.text and self.sched.detok is not None:
                r.text = self.sched.detok(r.output_ids)
        if self.listener is not None:
            for r in updated:
                self.listener(r)
