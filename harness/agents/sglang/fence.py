"""The fence, judged by happens-before (the article's "fence": the scheduler's table writes for
step N+1 must be ordered after step N's forward has read the table).

On a GPU the scheduler (schedule stream) writes `req_to_token` while the previous step's forward
(forward stream) may still read it; SGLang orders them with its write-after-read barrier
(Scheduler._apply_war_barrier: the schedule stream waits on the forward's read-done event, or on
the whole forward stream). On SGLang's CPU backend every stream is the host thread, so a missing
or misplaced fence never races: the forward is done before the next write. This model gives the
GPU's order back, deterministically: it records what the code *orders*, not what happened to
finish first, and judges every write against it.

Vector clocks over the streams: a stream's own position advances when a forward on it starts
reading and when it stops (torch_native attention reads req_to_token in every layer, so a step's
reads span its whole forward; the overlap loop runs the forward on the forward stream, the normal
loop on the schedule stream itself). Every stream, event and the host know every other stream up
to some position:
- an event records what its stream knows, its own position included;
- `wait_event(ev)` / `wait_stream(other)` raise the waiting stream's knowledge to the event's /
  the other stream's;
- a host wait on an event (`synchronize`: the result processors on step N's copy-done) raises
  the host's knowledge, and everything the host enqueues later is after it.
A write to req_to_token enqueued on stream S (the host's current stream, or the host itself
for a CPU tensor the scheduler writes directly) is ordered after a step's reads when S's or the
host's knowledge reaches the step's end. A write that overlaps the rows and positions of a
step whose reads it is not ordered after (the step is in flight in the GPU's sense: launched,
its reads not known done) is a write-after-read hazard, reported with both steps and the rows.
A write on the stream the step reads on is ordered by the stream itself.
"""
from __future__ import annotations

from collections import deque

FORWARD = "forward"


class FenceModel:
    """Vector clocks over SGLang's streams: each stream's own position advances when a forward on
    it starts and stops reading; each stream, each event and the host know every other stream up
    to some position."""

    def __init__(self, facts, keep: int = 8):
        self.facts = facts
        self.clock: dict[str, int] = {}  # stream -> its own position
        self.knows: dict[str, dict[str, int]] = {}  # stream -> {other stream: the position it waits behind}
        self.host: dict[str, int] = {}  # stream -> the position the host has synchronised with
        self.steps: deque = deque(maxlen=keep)  # [step, stream, {row: reads end}, begin, end]
        self.n = 0
        self.names: dict[int, str] = {}

    # -- streams -----------------------------------------------------------------------------------
    def name(self, stream) -> str:
        if stream is None:
            return "host"
        return self.names.get(id(stream), f"stream-{id(stream):x}")

    def name_streams(self, **streams) -> None:
        for nm, s in streams.items():
            if s is not None:
                self.names[id(s)] = nm

    def view(self, stream: str) -> dict[str, int]:
        """What work enqueued now on `stream` is ordered after: {stream: position}."""
        out = dict(self.host)
        for k, v in self.knows.get(stream, {}).items():
            out[k] = max(out.get(k, 0), v)
        out[stream] = self.clock.get(stream, 0)  # its own earlier work: stream order
        return out

    def _merge(self, stream: str, seen: dict[str, int]) -> None:
        k = self.knows.setdefault(stream, {})
        for s, v in seen.items():
            if s != stream:
                k[s] = max(k.get(s, 0), v)

    # -- the forward's reads -----------------------------------------------------------------------
    def forward_begins(self, rows: dict[int, int], stream: str = FORWARD) -> int:
        """A forward on `stream` starts reading req_to_token rows {row: positions [0, end)}."""
        self.n += 1
        self.clock[stream] = self.clock.get(stream, 0) + 1
        self.steps.append([self.n, stream, dict(rows), self.clock[stream], None])
        return self.n

    def forward_ends(self, step: int) -> None:
        for s in self.steps:
            if s[0] == step:
                self.clock[s[1]] = self.clock.get(s[1], 0) + 1
                s[4] = self.clock[s[1]]

    # -- ordering ----------------------------------------------------------------------------------
    def recorded(self, ev, stream_name: str) -> None:
        try:
            ev._oh_seen = self.view(stream_name)
        except AttributeError:
            pass

    def waited_event(self, stream_name: str, ev) -> None:
        seen = getattr(ev, "_oh_seen", None)
        if seen:
            self._merge(stream_name, seen)

    def waited_stream(self, stream_name: str, other: str) -> None:
        self._merge(stream_name, self.view(other))

    def host_synced(self, seen) -> None:
        for s, v in (seen or {}).items():
            self.host[s] = max(self.host.get(s, 0), v)

    # -- the scheduler's writes --------------------------------------------------------------------
    def write(self, stream_name: str, ranges, what: str) -> list[str]:
        """A write of req_to_token [(row, lo, hi)] enqueued on `stream_name`: the hazards it makes."""
        if not ranges:
            return []
        view = self.view(stream_name)
        facts = self.facts
        facts.add("fence_writes")
        out, fenced = [], False
        for step, on, rows, begin, end in self.steps:
            hit = [(r, lo, hi) for r, lo, hi in ranges if r in rows and lo < rows[r] and hi > lo]
            if not hit or on == stream_name:
                continue  # nothing shared, or the same stream: ordered by the stream itself
            if end is not None and end <= self.host.get(on, 0):
                continue  # the host itself waited for that step: nothing of it is in flight
            known = view.get(on, 0)
            if end is not None and end <= known:
                fenced = True  # in flight, and ordered behind its reads by a stream wait: the fence worked
                continue
            r, lo, hi = hit[0]
            out.append(f"{what} writes req_to_token row {r} [{lo}, {hi}) on the {stream_name} stream while "
                       f"forward step {step} (on the {on} stream) reads row {r} [0, {rows[r]}) and is in flight "
                       f"(launched, not synchronised by the host); the {stream_name} stream waits behind {on} "
                       f"position {known}, that step's reads end at "
                       f"{end if end is not None else 'its end, not yet enqueued'} (began {begin}): no fence "
                       f"orders the write after them")
        if fenced:
            facts.add("fence_ordered_conflicts")
        if out:
            facts.add("fence_hazards", len(out))
            if not facts.data.get("first_fence_hazard"):
                facts.set(first_fence_hazard=out[0][:600])
        return out


def ranges_of_write(indices, values=None) -> list[tuple[int, int, int]]:
    """ReqToTokenPool.write(indices, values)'s cells as [(row, lo, hi)]: indices is (row, slice),
    (rows, positions) tensors / lists, or a bare row."""
    def ints(x):
        if hasattr(x, "tolist"):
            x = x.tolist()
        return x if isinstance(x, list) else [x]
    if not isinstance(indices, tuple) or len(indices) != 2:
        return [(int(r), 0, 1 << 30) for r in ints(indices)]
    rows, cols = indices
    if isinstance(cols, slice):
        lo = cols.start or 0
        hi = cols.stop if cols.stop is not None else 1 << 30
        return [(int(r), int(lo), int(hi)) for r in ints(rows)]
    rows, cols = ints(rows), ints(cols)
    if len(rows) == 1 and len(cols) > 1:
        rows = rows * len(cols)
    return [(int(r), int(c), int(c) + 1) for r, c in zip(rows, cols)]


def ranges_of_assign(req_pool_indices, start_offset, end_offset) -> list[tuple[int, int, int]]:
    """assign_req_to_token_pool's cells: row i gets positions [start[i], end[i])."""
    return [(int(r), int(s), int(e)) for r, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(),
                                                         end_offset.tolist()) if e > s]


def reads_of_batch(batch) -> dict[int, int]:
    """What a step's forward reads of req_to_token: each row's positions [0, seq_len)."""
    rows = getattr(batch, "req_pool_indices", None)
    lens = getattr(batch, "seq_lens_cpu", None)
    if lens is None:
        lens = getattr(batch, "seq_lens", None)
    if rows is None or lens is None:
        return {}
    out: dict[int, int] = {}
    for r, n in zip(rows.tolist(), lens.tolist()):
        out[int(r)] = max(out.get(int(r), 0), int(n))
    return out


def judge_write(hb: FenceModel, facts, what: str, ranges) -> None:
    """A req_to_token write seen by the agent: on the host's current stream, judged now."""
    try:
        import torch
        stream = hb.name(torch.cpu.current_stream())
        hazards = hb.write(stream, ranges(), f"{what} (before step {hb.n + 1}'s forward)")
    except (AttributeError, TypeError, ValueError, RuntimeError) as e:
        facts.set(fence_unread=str(e)[:200])
        return
    if hazards:
        facts.write(True)


def install(facts, originals: dict) -> FenceModel:
    """Record the order SGLang's code sets up between its CPU streams: PyTorch's CPU Stream and
    Event do nothing, so their methods are wrapped (in this scheduler process only; `originals`
    is the agent's, which restores them) to tell the model, then do what they did."""
    import torch
    hb = FenceModel(facts)
    S, E = torch.cpu.Stream, torch.cpu.Event
    orig = {(S, "wait_stream"): S.wait_stream, (S, "wait_event"): S.wait_event,
            (E, "record"): E.record, (E, "synchronize"): E.synchronize}

    def wait_stream(self, stream):
        hb.waited_stream(hb.name(self), hb.name(stream))
        return orig[(S, "wait_stream")](self, stream)

    def wait_event(self, event):
        hb.waited_event(hb.name(self), event)
        return orig[(S, "wait_event")](self, event)

    def record(self, stream=None):
        hb.recorded(self, hb.name(stream if stream is not None else torch.cpu.current_stream()))
        return orig[(E, "record")](self, stream)

    def synchronize(self):
        hb.host_synced(getattr(self, "_oh_seen", None))
        return orig[(E, "synchronize")](self)

    for (cls, attr), fn in zip(orig, (wait_stream, wait_event, record, synchronize)):
        originals[f"torch.cpu.{cls.__name__}.{attr}"] = (cls, attr, orig[(cls, attr)])
        setattr(cls, attr, fn)
    facts.set(fence_model=True)
    return hb


# -- the agent's points that write req_to_token (each write judged against the model) ---------------
def table_write(agent, orig):
    def write(self, indices, values, *a, **kw):
        agent.table_written("write", lambda: ranges_of_write(indices, values))
        return orig(self, indices, values, *a, **kw)
    return write


def table_assign(agent, orig):
    def assign_req_to_token_pool_func(req_pool_indices, req_to_token, start_offset, end_offset, *a, **kw):
        agent.table_written("assign", lambda: ranges_of_assign(req_pool_indices, start_offset, end_offset))
        return orig(req_pool_indices, req_to_token, start_offset, end_offset, *a, **kw)
    return assign_req_to_token_pool_func
