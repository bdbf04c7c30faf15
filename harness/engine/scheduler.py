"""Continuous batching on the CPU: admission (prefill), reservation of slots before
a step, retraction when the pool is full, and stop conditions.

The scheduler only plans; loop.py turns a plan into device ops. Every write it
wants in the slot table is queued in `row_writes` and issued on the schedule
stream, behind the fence.
"""
from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass, field

from harness.engine.config import EngineConfig, ModelConfig
from harness.engine.memory import KVPool, PrefixCache, Rows
from harness.engine.request import Request, State

FINISHED_WINDOW = 1024  # finished requests the scheduler keeps (sched.finished)


@dataclass
class Batch:
    step: int
    kind: str  # "prefill" | "decode"
    reqs: list[Request]
    gens: list[int]
    rows: list[int]
    entries: list[int]
    positions: list[list[int]]  # per request, the positions its tokens take in this step
    input_ids: list[list[int]]  # prefill only: the tokens to compute (decode reads the relay)
    temperature: list[float]
    top_p: list[float]
    seeds: list[int]
    penalty: list[float]
    cpu_tokens: list[list[int]]  # the CPU's view of each request's tokens (one step old under overlap)
    ring: int = 0
    reserved: list = None  # decode: positions each row was filled to when the step was planned
    history_ids: list = None  # prefill: each request's whole sequence, for the device-side token history
    done: object = None  # copy-done event
    fence_event: object = None

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def n_tokens(self) -> int:
        return sum(len(p) for p in self.positions)


def _unpack_logprobs(row: list[float]) -> tuple[float, list[tuple[int, float]]]:
    """[chosen, top-K values, top-K ids] -> (chosen logprob, [(token, logprob), ...])."""
    k = (len(row) - 1) // 2
    return row[0], [(int(t), v) for v, t in zip(row[1:1 + k], row[1 + k:])]


class Scheduler:
    def __init__(self, cfg: EngineConfig, mcfg: ModelConfig, pool: KVPool, rows: Rows, entries: Rows,
                 cache: PrefixCache, detok=None, window: int = 1):
        self.cfg, self.mcfg = cfg, mcfg
        self.pool, self.rows, self.entries, self.cache = pool, rows, entries, cache
        self.detok = detok  # ids -> text, for stop strings
        self.window = window  # tokens a step may add per request (1 for plain decoding)
        self.n_windows = 1 if "single_window" in cfg.faults else 2
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.row_writes: list[tuple[int, int, list[int], str]] = []  # (row, start position, slots, request)
        # the newest finished requests (a window: a server finishes requests forever; the
        # caller that submitted a request keeps it)
        self.finished: deque[Request] = deque(maxlen=FINISHED_WINDOW)
        self.n_retracted = 0
        self.n_discarded = 0  # rows of a step whose result was thrown away (finished or retracted)
        self.n_row_rewrites = 0  # rows pointed at pages another request cached first
        self.violations: list[str] = []  # invariants seen broken (a speculative window past its slots)
        self.min_slack = 1 << 30  # fewest reserved positions left past a speculative window

    # -- requests ------------------------------------------------------------------
    def add(self, r: Request) -> None:
        r.state = State.WAITING
        self.waiting.append(r)

    def abort(self, r: Request) -> None:
        """The client went away: a waiting request ends now, a running one after one more step."""
        if r.state is State.WAITING:
            self.waiting.remove(r)
            self._finish(r, "abort")
        elif r.state is State.RUNNING and "abort_drops_inflight" in self.cfg.faults:
            self._finish(r, "abort")  # the defect: ends now, dropping the step already in flight
        elif r.state is State.RUNNING:
            if r.hit_pages and "abort_prefix_double_ref" in self.cfg.faults:
                self.cache.lock(r.cached_nodes)  # the fault: its cached pages' references taken again
            r.aborted = True

    def sample_seed(self, r: Request) -> int:
        if r.seed is not None:
            return int(r.seed) & 0x7FFFFFFF
        return zlib.crc32(f"{self.cfg.seed}:{r.rid}".encode()) & 0x7FFFFFFF

    # -- reservation -------------------------------------------------------------------
    def _pages_for(self, positions: int) -> int:
        ps = self.pool.page_size
        return -(-positions // ps)

    def _topup_need(self, r: Request) -> int:
        """Pages r needs so its row is filled `n_windows` windows beyond its count."""
        return max(0, self._pages_for(r.fill + self.n_windows * self.window) - len(r.pages))

    def reserve_windows(self, r: Request) -> None:
        """Top r's row up to `n_windows` windows past its count.

        Conservation: a running request holds no more pages than this reservation asks
        (len(pages) <= pages for fill + n_windows * window: its count only grows, so what was
        reserved never exceeds what its count now asks), and the reservation goes back with
        its pages when it leaves the batch."""
        need = self._topup_need(r)
        if need == 0:
            return
        start = len(r.pages) * self.pool.page_size
        new = self.pool.alloc(need, r.rid)
        r.pages.extend(new)
        end = len(r.pages) * self.pool.page_size
        self.row_writes.append((r.row, start, self.pool.slots(r.pages, start, end), r.rid))

    def _free_pages_for(self, need: int, protect: set) -> bool:
        """Make `need` pages free: drop unused cached prompts, then retract requests."""
        if need <= self.pool.free:
            return True
        self.cache.evict(need - self.pool.free)
        while need > self.pool.free:
            victims = [r for r in self.running if r not in protect]
            if not victims:
                return False
            # fewest output tokens first; among equals the latest admitted
            v = min(victims, key=lambda r: (len(r.output_ids), -self.running.index(r)))
            self.retract(v)
        return True

    # -- planning a step -------------------------------------------------------------
    def next_batch(self, step: int) -> Batch | None:
        b = self._plan_prefill(step)
        if b is not None:
            return b
        return self._plan_decode(step)

    def _plan_prefill(self, step: int) -> Batch | None:
        admitted: list[Request] = []
        budget = self.cfg.max_prefill_tokens
        # running requests keep what they need for their next decode step
        held = sum(self._topup_need(r) for r in self.running)
        while self.waiting:
            r = self.waiting[0]
            if len(self.running) >= self.cfg.max_running:  # admitted ones are running already
                break
            if self.rows.free == 0 or self.entries.free == 0:
                break
            seq = r.seq()
            nodes = self.cache.match(seq)
            n_new = len(seq) - len(nodes) * self.pool.page_size
            if admitted and n_new > budget:
                break
            need = self._pages_for(len(seq) + self.n_windows * self.window) - len(nodes)
            if need + held > self.pool.free:
                self.cache.lock(nodes)  # keep the match while evicting others
                if "evict_ref_twice" in self.cfg.faults:  # the fault: a second reference, by hand, never released
                    for n in nodes:
                        n.refs += 1
                self.cache.evict(need + held - self.pool.free)
                self.cache.unlock(nodes)
                if need + held > self.pool.free:
                    break
            self.waiting.popleft()
            self._admit(r, seq, nodes)
            admitted.append(r)
            budget -= n_new
        if not admitted:
            return None
        ps = self.pool.page_size
        positions, input_ids = [], []
        for r in admitted:
            seq = r.seq_at_admit
            start = r.n_cached_pages * ps
            positions.append(list(range(start, len(seq))))
            input_ids.append(seq[start:])
            r.fill = len(seq)
        return self._batch(step, "prefill", admitted, positions, input_ids)

    def _admit(self, r: Request, seq: list[int], nodes) -> None:
        self.cache.lock(nodes)
        r.cached_nodes = list(nodes)
        r.pages = [n.page for n in nodes]
        r.row = self.rows.alloc(r.rid)
        r.entry = self.entries.alloc(r.rid)
        r.fill = len(seq)
        r.seq_at_admit = list(seq)
        if r.gen == 0:  # a readmission after retraction finds its own pages: not a prefix hit
            r.hit_pages = len(nodes)
        r.gen += 1
        r.state = State.RUNNING
        new = self._topup_need(r)
        r.pages.extend(self.pool.alloc(new, r.rid))
        # the whole row: cached prefix pages and the new ones
        self.row_writes.append((r.row, 0, self.pool.slots(r.pages, 0, len(r.pages) * self.pool.page_size), r.rid))
        self.running.append(r)

    def _plan_decode(self, step: int) -> Batch | None:
        if not self.running:
            return None
        # every running request must be topped up before the step; else make room
        for r in sorted(self.running, key=lambda r: (-len(r.output_ids), self.running.index(r))):
            if r.state is not State.RUNNING:
                continue
            need = self._topup_need(r)
            if need and not self._free_pages_for(need, protect={r}):
                raise RuntimeError("pool cannot hold a single request: validation should have refused it")
            if r.state is State.RUNNING:
                self.reserve_windows(r)
        reqs = list(self.running)
        if not reqs:
            return None
        positions = [[r.fill] for r in reqs]  # speculative: the CPU's one-step-old count, not the position
        reserved = [len(r.pages) * self.pool.page_size for r in reqs]
        if self.window == 1:  # plain decoding: every step adds exactly one token, so the CPU knows
            for r in reqs:
                r.fill += 1
                if "early_free" in self.cfg.faults and r.fill - len(r.prompt_ids) + 1 >= r.max_new_tokens:
                    # the defect: the count advanced at schedule time says this step is r's last,
                    # so its decode pages go back to the pool before the step (queued next) has run
                    keep = max(r.n_cached_pages, len(r.seq_at_admit) // self.pool.page_size)  # the prompt's
                    self.pool.release(r.pages[keep:])
                    del r.pages[keep:]
        b = self._batch(step, "decode", reqs, positions, [])
        b.reserved = reserved
        return b

    def _batch(self, step, kind, reqs, positions, input_ids) -> Batch:
        return Batch(step=step, kind=kind, reqs=reqs, gens=[r.gen for r in reqs], rows=[r.row for r in reqs],
                     entries=[r.entry for r in reqs], positions=positions, input_ids=input_ids,
                     temperature=[float(r.temperature) for r in reqs], top_p=[float(r.top_p) for r in reqs],
                     seeds=[self.sample_seed(r) for r in reqs],
                     penalty=[float(r.repetition_penalty) for r in reqs],
                     cpu_tokens=[r.prompt_ids + r.output_ids if r.repetition_penalty != 1.0 else [] for r in reqs],
                     ring=step % 2)

    # -- leaving the batch -------------------------------------------------------------
    def _release(self, r: Request, keep_row: bool = False, keep_entry: bool = False) -> None:
        """Everything r holds goes back: its private pages, its locks on cached ones, its row
        and its relay entry (keep_row / keep_entry: the faults that forget one)."""
        self.cache.unlock(r.cached_nodes)
        self.pool.release(r.pages[r.n_cached_pages:])
        r.pages, r.cached_nodes = [], []
        if not keep_row:
            self.rows.release(r.row)
        if not keep_entry:
            self.entries.release(r.entry)
        r.row = r.entry = None
        if r in self.running:
            self.running.remove(r)

    def retract(self, r: Request) -> None:
        """Take r out of the batch: free its slots now, keep its output, queue it again."""
        # the fault `retract_keeps_entry`: the retraction path forgets the relay entry
        self._release(r, keep_entry="retract_keeps_entry" in self.cfg.faults)
        r.state = State.WAITING
        r.retractions += 1
        self.n_retracted += 1
        self.waiting.appendleft(r)

    def _finish(self, r: Request, reason: str) -> None:
        if r.state is State.RUNNING:
            # the fault `abort_keeps_row`: a request aborted while running ends when its step in
            # flight is processed, and that path forgets to return its slot-table row
            self._release(r, keep_row=r.aborted and "abort_keeps_row" in self.cfg.faults)
        r.state = State.FINISHED
        r.finish_reason = reason
        self.finished.append(r)

    # -- results (one step old under overlap) ------------------------------------------
    def process(self, batch: Batch, tokens: list[int], logprobs: list[list[float]] | None = None) -> list[Request]:
        """Take a step's result; returns the requests that got a token."""
        updated = []
        for i, r in enumerate(batch.reqs):
            if r.state is not State.RUNNING or r.gen != batch.gens[i]:
                self.n_discarded += 1  # the extra step of a finished or retracted request
                continue
            if batch.kind == "prefill":
                self._cache_prompt(r)
            if logprobs is not None:
                r.output_logprobs.append(_unpack_logprobs(logprobs[i]))
            self._append(r, tokens[i])
            updated.append(r)
        return updated

    def process_spec(self, batch: Batch, tokens: list[list[int]], accept: list[int], lens: list[int],
                     spec) -> list[Request]:
        """A speculative step's result: each request grew by its accept length (bonus included)."""
        updated = []
        for i, r in enumerate(batch.reqs):
            if r.state is not State.RUNNING or r.gen != batch.gens[i]:
                self.n_discarded += 1
                continue
            n = accept[i]
            spec.accept_lens.append(n)
            spec.accept_by_rid.setdefault(r.rid, []).append(n)
            self.min_slack = min(self.min_slack, batch.reserved[i] - (r.fill + spec.w))
            if r.fill + spec.w > batch.reserved[i]:  # the window ran past the reserved slots (Figure 7)
                self.violations.append(f"step {batch.step}: {r.rid} wrote positions {r.fill}..{r.fill + spec.w - 1} "
                                       f"but its row was reserved up to {batch.reserved[i] - 1}")
            if lens[i] != r.fill + n:  # the lengths copied early from the relay must agree
                self.violations.append(f"step {batch.step}: {r.rid} length {lens[i]} != {r.fill} + {n}")
            r.fill = lens[i]
            for t in tokens[i][:n]:
                # verify keeps no per-token record: a placeholder keeps records aligned with tokens
                # (a retracted request's re-prefill appends the record of a later token)
                r.output_logprobs.append(None)
                self._append(r, t)
                if r.state is not State.RUNNING:
                    break
            updated.append(r)
        return updated

    def _cache_prompt(self, r: Request) -> None:
        """Keep the prompt's full pages in the prefix cache; if another request cached a
        page first, free ours and rewrite the row to share its page."""
        nodes, dup = self.cache.insert(r.seq_at_admit, r.pages, r.n_cached_pages)
        if not nodes:
            return
        ps = self.pool.page_size
        for i, page in dup:
            if "dedup_keeps_page" not in self.cfg.faults:  # the fault: our duplicate is never freed
                self.pool.release([r.pages[i]])
            r.pages[i] = page
            self.row_writes.append((r.row, i * ps, self.pool.slots(r.pages, i * ps, (i + 1) * ps), r.rid))
            self.n_row_rewrites += 1
        self.cache.lock(nodes)
        self.cache.unlock(r.cached_nodes)
        r.cached_nodes = nodes

    def _append(self, r: Request, tok: int) -> None:
        r.output_ids.append(tok)
        if r.aborted:
            return self._finish(r, "abort")
        if tok in self.mcfg.eos_ids and not r.ignore_eos:
            return self._finish(r, "stop")
        if r.stop and self.detok is not None:
            text = self.detok(r.output_ids)
            if any(s in text for s in r.stop):
                return self._finish(r, "stop")
        if len(r.output_ids) >= r.max_new_tokens:
            return self._finish(r, "length")
        if r.abort_after is not None and len(r.output_ids) >= r.abort_after:
            r.aborted = True  # the client has seen enough; one more step, then it ends

    # -- invariants ------------------------------------------------------------------
    def accounting(self) -> tuple[int, int, int, int]:
        """(free, cached, in use, total) pages; free + cached + in use == total."""
        in_use = sum(len(r.pages) - r.n_cached_pages for r in self.running)
        return self.pool.free, self.cache.pages, in_use, self.pool.total

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running
