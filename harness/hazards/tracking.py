"""Access tracking and the happens-before hazard check (DESIGN.md, "Hazard detection").

Attach with `dev.tracker = AccessTracker(dev)`. The device calls three hooks:

- `executing(rec)` around each op's fn: a TorchDispatchMode sees every aten call and
  records which elements of which *named buffer* (a tensor in `dev.buffers`, or any view
  of one) it reads or writes. A tensor is resolved to its buffer by untyped-storage
  identity, and to elements of that buffer by storage offset, sizes and strides, so
  overlapping views of one buffer are compared element by element. Which arguments are
  written comes from the op schema (alias_info.is_write: in-place and out= arguments);
  the other tensor arguments are read; outputs are fresh; view ops touch nothing.
  index / index_select / gather / embedding (reads) and index_copy_ / index_put_ /
  scatter_ (writes) are resolved to the indexed elements only, by applying the same
  indexing to a map of element numbers.
- `host_access(...)`: the host reads or writes a (pinned) buffer, thread "host".
- `host_sync(...)`: the host waited on an event; blocking calls are checked for stalls.

Granularity: one element of 1-D and 2-D buffers (a slot-table entry `req_to_token[row,
pos]`); buffers of 3 or more dims (the KV pools `[slots, heads, dim]`) are tracked per
dim-0 row, i.e. per KV slot (`row_unit_ndim`; None tracks every element everywhere).

The check. Accesses are stamped with their op's vector clock (program order). Two
accesses to a common element of a buffer, at least one a write, from different threads
(streams, host) are a hazard when neither happens before the other
(`clocks.happens_before` on the accessing thread's component: a of thread t happens before
b iff a.clock[t] <= b.clock[t]; the vectorized check below is that test). Accesses are buffered
when they execute and checked in *issue order* (op id; a host access sits between the
ops issued before and after it), which is a linearization of happens-before, so the
result is the same whichever order a schedule policy ran the ops in: it fires on the
first step even under the serial policy, where nothing goes wrong.

Shadow state, FastTrack style: per buffer, per thread that touched it, two arrays over
the buffer's elements: the thread's last write of each element, and its last read since
that write (as access numbers; a thread's access numbers grow with its clock epoch).
Checked in a linearization of happens-before, an access x is unordered with some earlier
conflicting access of thread t iff it is unordered with the last write (or, for a write,
the last read since it) of t that the arrays hold, so the state is constant per element
and the check is one vectorized comparison (`access number > the last access of t whose
epoch x's clock has seen`). A per-thread maximum epoch skips even that when everything t
did is ordered before x (the common case behind a fence). An op's accesses to a buffer
are merged (reads, then writes) before they are checked.

Memory reuse: elements are keyed by named buffer + element index (a slot-table row, a KV
slot), not by data pointer or allocation, so a row freed by the CPU and handed to another
request is still the same elements and a read for the old owner stays comparable with a
write for the new one.

Host stalls (kind "host-stall"): the tracker keeps what the host knows of every stream
(the join of the events it waited on). A blocking call on stream S is a stall when S's
clock at that point has joined work of another device stream T that the host does not
know yet: the host then waits, through S, for T (e.g. a blocking copy on the schedule
stream, which is chained behind the forward step by the fence).
"""
from __future__ import annotations

import bisect
import heapq
import math

from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from harness.hazards.report import Hazard, Side, format_hazard, summarize_elements

HOST = "host"
aten = torch.ops.aten

# indexing ops resolved to the elements they index (through their first argument)
_INDEX_READ = {aten.index, aten.index_select, aten.gather, aten.embedding}
_INDEX_WRITE = {aten.index_copy_, aten.index_put_, aten._index_put_impl_, aten.scatter_, aten.scatter_add_,
                aten.scatter_reduce_}
_INDEXING = _INDEX_READ | _INDEX_WRITE


class _Buf:
    """A named buffer and its shadow state."""

    __slots__ = ("name", "base", "numel", "shape", "itemsize", "off", "unit", "nunits", "_flat", "threads")

    def __init__(self, name: str, t: torch.Tensor, row_unit_ndim: int | None):
        self.name, self.base = name, t
        self.numel, self.shape = t.numel(), tuple(t.shape)
        self.itemsize = t.element_size()
        self.off = t.storage_offset()
        u = 1
        if row_unit_ndim is not None and t.dim() >= row_unit_ndim and t.is_contiguous() and t.numel():
            u = t.numel() // t.shape[0]
        self.unit = u
        self.nunits = self.numel // u
        self._flat = None
        self.threads: dict[str, _Shadow] = {}

    @property
    def flat(self) -> torch.Tensor:
        if self._flat is None:
            self._flat = torch.arange(self.numel, dtype=torch.int64)
        return self._flat

    def rows_view(self, t: torch.Tensor) -> int | None:
        """For a row-granular buffer: the first row of `t` when `t` is a run of whole rows, else None."""
        u = self.unit
        if t.dim() != len(self.shape) or tuple(t.shape[1:]) != self.shape[1:] or t.stride() != self.base.stride():
            return None
        off = t.storage_offset() - self.off
        return off // u if off % u == 0 else None


class _Shadow:
    """One thread's last write, and last read since that write, of every unit of a buffer."""

    __slots__ = ("w", "r", "max_w", "max_r", "eps", "ids")

    def __init__(self, n: int):
        self.w = torch.zeros(n, dtype=torch.int32)  # access number (0: none)
        self.r = torch.zeros(n, dtype=torch.int32)
        self.max_w = 0  # largest epoch written / read
        self.max_r = 0
        self.eps: list[int] = []  # epochs of this thread's accesses to the buffer, increasing
        self.ids: list[int] = []  # and their access numbers

    def last_seen(self, ct: int) -> int:
        """The largest access number of this thread at an epoch <= ct (0: none)."""
        i = bisect.bisect_right(self.eps, ct)
        return self.ids[i - 1] if i else 0


@dataclass(frozen=True)
class Access:
    """One op's (or the host's) read or write of a logged buffer; units are elements, or
    dim-0 rows for buffers of 3 or more dimensions."""

    op_id: int | None
    thread: str
    name: str
    step: int
    meta: dict
    clock: object
    buffer: str
    units: list
    write: bool
    # the units of each aten call in call order, unsorted (a slice or a LongTensor per call):
    # an indexing call keeps its index order, so a checker can map units back to the tokens
    # or rows that touched them (slot ownership)
    parts: tuple = ()


class _Actor:
    """An op (or a host access) as the check sees it, with its accesses to merge."""

    __slots__ = ("idx", "thread", "clock", "key", "name", "site", "step", "meta", "op_id", "acc")

    def __init__(self, idx, thread, clock, key, name, site, step, meta, op_id):
        self.idx, self.thread, self.clock, self.key = idx, thread, clock, key
        self.name, self.site, self.step, self.meta, self.op_id = name, site, step, meta, op_id
        self.acc: dict[tuple, list] = {}  # (buf, write) -> element sets

    @property
    def epoch(self) -> int:
        return self.clock.get(self.thread)


class _Found:
    __slots__ = ("kind", "buf", "first", "fw", "second", "sw", "elems")

    def __init__(self, kind, buf, first, fw, second, sw):
        self.kind, self.buf, self.first, self.fw, self.second, self.sw = kind, buf, first, fw, second, sw
        self.elems: list[torch.Tensor] = []


def _func_info(func):
    """Per overload: None for view ops and ops without tensor arguments, else
    [(position, argument name, is_write, is_list)] for its tensor arguments."""
    if func.is_view:
        return None
    out = []
    for i, a in enumerate(func._schema.arguments):
        ts = str(a.type)
        if "Tensor" not in ts:
            continue
        w = a.alias_info is not None and a.alias_info.is_write
        out.append((i, a.name, w, ts.endswith("[]")))
    return out or None


class _Mode(TorchDispatchMode):
    def __init__(self, tracker: "AccessTracker"):
        super().__init__()
        self.tracker = tracker
        self.finfo: dict[int, object] = {}  # id(OpOverload) -> _func_info (overloads are never freed)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # nothing here runs under torch.compile; skipping the dynamo-disable wrapper halves the
        # per-call cost of the mode
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        info = self.finfo.get(id(func), 0)
        if info == 0:
            info = self.finfo[id(func)] = _func_info(func)
        if info is not None:
            # the fast scan, inline: does any tensor argument live in a named buffer's storage?
            by = self.tracker._by_storage
            found = None
            for i, name, w, is_list in info:
                v = args[i] if i < len(args) else kwargs.get(name)
                if v is None:
                    continue
                for t in (v if is_list else (v,)):
                    if isinstance(t, torch.Tensor):
                        try:
                            b = by.get(t.untyped_storage()._cdata)
                        except (RuntimeError, NotImplementedError):
                            continue
                        if b is not None:
                            if found is None:
                                found = []
                            found.append((i, t, b, w))
            if found is not None:
                self.tracker._on_call(func, found, args, kwargs)
        return func._op(*args, **kwargs)


_push_dispatch = torch._C._push_on_torch_dispatch_stack
_pop_dispatch = torch._C._pop_torch_dispatch_stack


def _touches(by: dict, seq) -> bool:
    """Does any tensor in `seq` (or in a list / tuple in it) live in a named buffer's storage?"""
    for x in seq:
        if isinstance(x, torch.Tensor):
            try:
                if x.untyped_storage()._cdata in by:
                    return True
            except (RuntimeError, NotImplementedError):
                pass
        elif isinstance(x, (list, tuple)):
            for y in x:
                if isinstance(y, torch.Tensor):
                    try:
                        if y.untyped_storage()._cdata in by:
                            return True
                    except (RuntimeError, NotImplementedError):
                        pass
    return False


class _Filter(TorchFunctionMode):
    """A cheap pre-filter: a torch function none of whose arguments is (a view of) a named
    buffer cannot touch one, so only the others run under the dispatch mode. This keeps
    the per-call cost of the dispatch mode off the model's arithmetic on weights and
    temporaries. (A torch function only reaches tensors through its arguments.)"""

    def __init__(self, tracker: "AccessTracker"):
        super().__init__()
        self.tracker = tracker

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        by = self.tracker._by_storage
        hit = False
        for x in args:  # _touches, inlined for the common case of plain tensor arguments
            if isinstance(x, torch.Tensor):
                try:
                    if x.untyped_storage()._cdata in by:
                        hit = True
                        break
                except (RuntimeError, NotImplementedError):
                    pass
            elif isinstance(x, (list, tuple)) and _touches(by, x):
                hit = True
                break
        if hit or (kwargs and _touches(by, kwargs.values())):
            # the dispatch mode was entered (its flags set) for the whole op and taken off the
            # stack again; put it back for this call only (the raw push / pop is cheap)
            _push_dispatch(self.tracker._mode)
            try:
                return func(*args, **kwargs)
            finally:
                _pop_dispatch(None)
        return func(*args, **kwargs)


class _Executing:
    __slots__ = ("tracker", "rec")

    def __init__(self, tracker: "AccessTracker", rec):
        self.tracker, self.rec = tracker, rec

    def __enter__(self):
        tr = self.tracker
        tr._cur, tr._cur_actor = self.rec, None
        tr._mode.__enter__()
        if tr._filter is not None:
            _pop_dispatch(None)  # only the calls the filter lets through run under the dispatch mode
            tr._filter.__enter__()
        return self

    def __exit__(self, *exc):
        tr = self.tracker
        if tr._filter is not None:
            tr._filter.__exit__(*exc)
            _push_dispatch(tr._mode)
        tr._mode.__exit__(*exc)
        a = tr._cur_actor
        tr._cur, tr._cur_actor = None, None
        if a is not None:
            tr._push(a)
        if tr._pending:
            tr._drain(tr._watermark())
        return False


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NULL = _Null()


class AccessTracker:
    """Happens-before hazard detector over a device's named buffers.

    ignore: buffer-name prefixes not to track (e.g. ("fwd.",) for forward-only scratch).
    precise_indices: resolve indexing ops to the indexed elements (else the whole view).
    row_unit_ndim: buffers with at least this many dims are tracked per dim-0 row (None: per element).
    prefilter: run only torch functions that take a named buffer under the dispatch mode (a
        TorchFunctionMode decides); False runs every aten call of an op under it.
    max_hazards: distinct (buffer, op pair, kind) hazards kept; later ones are only counted in `dropped`.
    """

    def __init__(self, dev, ignore: tuple[str, ...] | list[str] = (), precise_indices: bool = True,
                 row_unit_ndim: int | None = 3, max_hazards: int = 10000, prefilter: bool = True,
                 log: tuple[str, ...] = ()):
        self.dev = dev
        # buffers (by name prefix) whose every access is kept in `self.log`, in issue order,
        # for suites that check more than ordering (fence placement, relay hygiene)
        self.log_prefixes = tuple(log)
        self.log: list[Access] = []
        self.ignore = tuple(ignore)
        self.precise_indices = precise_indices
        self.row_unit_ndim = row_unit_ndim
        self.max_hazards = max_hazards
        self._mode = _Mode(self)
        self._filter = _Filter(self) if prefilter else None
        self._nbufs = -1
        self._by_storage: dict[int, _Buf] = {}
        self.reset()

    # -- state ------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every access and hazard (buffers stay registered)."""
        for b in self._by_storage.values():
            b.threads.clear()
        self._actors: list[_Actor | None] = [None]  # by access number; 0 is "none"
        self._pending: list = []
        self._seq = 0
        self._found: dict = {}
        self._stalls: list[Hazard] = []
        self._cache: list[Hazard] | None = None
        self.dropped = 0
        self._cur = None
        self._cur_actor = None
        self._host_known = self.dev.host_clock.copy()
        self.blocking_calls: list[dict] = []

    def _refresh(self) -> None:
        bufs = self.dev.buffers
        if len(bufs) == self._nbufs:
            return
        old = self._by_storage
        new: dict[int, _Buf] = {}
        for name, t in bufs.items():
            if self.ignore and name.startswith(self.ignore):
                continue
            key = t.untyped_storage()._cdata
            prev = old.get(key)
            if prev is not None and prev.base is t:
                new[key] = prev
            elif key not in new or new[key].numel < t.numel():
                new[key] = _Buf(name, t, self.row_unit_ndim)
        self._by_storage = new
        self._nbufs = len(bufs)

    # -- device hooks ---------------------------------------------------------------------
    def executing(self, rec):
        """Context manager around an op's fn: track its buffer accesses."""
        self._refresh()
        if not self._by_storage:
            return _NULL
        return _Executing(self, rec)

    def host_access(self, name, tensor, write, clock, site, step) -> None:
        self._refresh()
        buf = self._resolve(tensor)
        if buf is None:
            t = self.dev.buffers.get(name)
            if t is None:
                return
            buf = self._resolve(t)
            if buf is None:
                return
            el = slice(0, buf.nunits)
        else:
            el = self._elements(buf, tensor)
        if el is None:
            return
        key = self.dev._next_id - 0.5  # after every op issued so far, before the next one
        a = self._new_actor(HOST, clock, key, "host " + ("write" if write else "read"), site, step, {}, None)
        a.acc[(buf, bool(write))] = [el]
        self._push(a)
        self._drain(self._watermark())

    def host_sync(self, event, blocking_call, site, step) -> None:
        known = self._host_known
        if blocking_call:
            s = event.stream.name
            self.blocking_calls.append({"stream": s, "site": site, "step": step})
            for t, v in list(event.clock.c.items()):
                if t != s and t != HOST and v > known.get(t):
                    self._stalls.append(self._stall(s, t, v, site, step))
                    self._cache = None
        known.join(event.clock)
        if self._pending:
            self._drain(self._watermark())

    # -- results --------------------------------------------------------------------------
    @property
    def hazards(self) -> list[Hazard]:
        """Every hazard found so far, in issue order of the later access (then of the earlier)."""
        if self._pending:
            self._drain(self._watermark())
        if self._cache is None:
            hs = [self._build(f) for f in self._found.values()] + list(self._stalls)
            hs.sort(key=lambda h: (h.order[1], h.order[0]))
            self._cache = hs
        return list(self._cache)

    def first_hazard(self) -> Hazard | None:
        hs = self.hazards
        return hs[0] if hs else None

    def flush(self) -> None:
        """Check every buffered access now, even ahead of ops not yet run."""
        self._drain(math.inf)

    def report(self, limit: int = 10) -> str:
        hs = self.hazards
        if not hs:
            return "no hazards"
        out = [format_hazard(h) for h in hs[:limit]]
        if len(hs) > limit:
            out.append(f"... and {len(hs) - limit} more")
        return "\n\n".join(out)

    # -- recording ----------------------------------------------------------------------
    def _new_actor(self, thread, clock, key, name, site, step, meta, op_id) -> _Actor:
        a = _Actor(len(self._actors), thread, clock, key, name, site, step, meta, op_id)
        self._actors.append(a)
        return a

    def _push(self, actor: _Actor) -> None:
        self._seq += 1
        heapq.heappush(self._pending, (actor.key, self._seq, actor))

    def _watermark(self) -> float:
        """Issue id below which every op has run (sim: the smallest id still queued)."""
        qs = getattr(self.dev, "queues", None)
        if not qs:
            return math.inf
        m = math.inf
        for q in qs.values():
            if q:
                i = q[0].rec.id
                if i < m:
                    m = i
        return m

    def _drain(self, upto: float) -> None:
        p = self._pending
        while p and p[0][0] < upto:
            self._apply_actor(heapq.heappop(p)[2])

    def _resolve(self, t) -> _Buf | None:
        if not isinstance(t, torch.Tensor):
            return None
        try:
            return self._by_storage.get(t.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):
            return None

    def _elements(self, buf: _Buf, t: torch.Tensor):
        """The units of `buf` that view `t` covers: a slice, a 1-D LongTensor, or None (empty)."""
        n = t.numel()
        if n == 0:
            return None
        if t.element_size() != buf.itemsize:
            return slice(0, buf.nunits)
        off = t.storage_offset() - buf.off
        u = buf.unit
        if t.is_contiguous():
            lo, hi = max(off, 0), min(off + n, buf.numel)
            if hi <= lo:
                return None
            return slice(lo, hi) if u == 1 else slice(lo // u, -(-hi // u))
        try:
            flat = buf.flat.as_strided(t.shape, t.stride(), off).reshape(-1)
        except RuntimeError:
            return slice(0, buf.nunits)
        return flat if u == 1 else flat // u

    def _on_call(self, func, found, args, kwargs) -> None:
        """Record an aten call's accesses: found = [(argument position, tensor, buffer, is_write)]."""
        a = self._cur_actor
        if a is None:
            r = self._cur
            a = self._cur_actor = self._new_actor(r.stream, r.clock, float(r.id), r.name, r.site, r.step,
                                                  r.meta, r.id)
        for i, t, b, w in found:
            el = None
            if i == 0 and self.precise_indices and func.overloadpacket in _INDEXING:
                el = self._precise(func.overloadpacket, b, t, args, kwargs)
                if el is not None and el.numel() == 0:
                    continue
            if el is None:
                el = self._elements(b, t)
                if el is None:
                    continue
            lst = a.acc.get((b, w))
            if lst is None:
                a.acc[(b, w)] = [el]
            else:
                lst.append(el)

    def _precise(self, packet, buf: _Buf, t, args, kwargs):
        """Units of `buf` an indexing op reads or writes through its first argument, or None."""
        try:
            if packet is aten.index or packet is aten.index_put_ or packet is aten._index_put_impl_:
                idx = list(args[1] if len(args) > 1 else kwargs["indices"])
                while idx and idx[-1] is None:
                    idx.pop()
                if len(idx) == 1 and idx[0] is not None and idx[0].dtype != torch.bool:
                    rows = self._rows(buf, t, idx[0])
                    if rows is not None:
                        return rows
                m = self._index_map(buf, t)
                if m is None:
                    return None
                return self._units(buf, aten.index.Tensor(m, [None if x is None else x.cpu() for x in idx]))
            if packet is aten.embedding:
                idx = args[1] if len(args) > 1 else kwargs["indices"]
                rows = self._rows(buf, t, idx)
                if rows is not None:
                    return rows
                m = self._index_map(buf, t)
                return None if m is None else self._units(buf, m[idx.cpu()])
            dim = args[1] if len(args) > 1 else kwargs["dim"]
            index = args[2] if len(args) > 2 else kwargs["index"]
            if packet is aten.index_select or packet is aten.index_copy_:
                if dim == 0 or dim == -t.dim():
                    rows = self._rows(buf, t, index)
                    if rows is not None:
                        return rows
                m = self._index_map(buf, t)
                return None if m is None else self._units(buf, m.index_select(dim, index.cpu().reshape(-1)))
            # gather / scatter_*: the elements `index` addresses along dim
            m = self._index_map(buf, t)
            return None if m is None else self._units(buf, m.gather(dim, index.cpu()))
        except (RuntimeError, KeyError, IndexError, TypeError, ValueError):
            return None

    def _rows(self, buf: _Buf, t, index):
        """Dim-0 indexing of a row-granular buffer through a run of whole rows: the row numbers."""
        if buf.unit == 1 or t.dim() == 0:
            return None
        r0 = buf.rows_view(t)
        idx = index.cpu().reshape(-1).to(torch.int64)
        idx = torch.where(idx < 0, idx + t.shape[0], idx)
        if r0 is None:
            # a contiguous view that cuts whole rows into shorter ones (the KV pool as
            # [slots * kv_heads, head_dim], which attention gathers head-major): the unit of
            # each indexed row, without mapping every element
            n = t[0].numel() if t.shape[0] else 0
            off = t.storage_offset() - buf.off
            if (not n or not t.is_contiguous() or t.element_size() != buf.itemsize or buf.unit % n
                    or off % n):
                return None
            return (off + idx * n) // buf.unit
        return idx + r0 if r0 else idx

    def _index_map(self, buf: _Buf, t: torch.Tensor):
        if t.element_size() != buf.itemsize:
            return None
        try:
            return buf.flat.as_strided(t.shape, t.stride(), t.storage_offset() - buf.off)
        except RuntimeError:
            return None

    @staticmethod
    def _units(buf: _Buf, flat: torch.Tensor) -> torch.Tensor:
        flat = flat.reshape(-1)
        return flat if buf.unit == 1 else flat // buf.unit

    # -- the check ------------------------------------------------------------------------
    def _apply_actor(self, a: _Actor) -> None:
        # reads first, then writes: an op that reads and writes an element counts as its writer
        items = sorted(a.acc.items(), key=lambda kv: kv[0][1])
        for (buf, write), els in items:
            if len(els) == 1:
                el = els[0]
            else:
                el = torch.cat([torch.arange(e.start, e.stop, dtype=torch.int64) if isinstance(e, slice) else e
                                for e in els])
            self._apply(a, buf, el, write)
            if self.log_prefixes and buf.name.startswith(self.log_prefixes):
                units = torch.arange(el.start, el.stop) if isinstance(el, slice) else el
                self.log.append(Access(a.op_id, a.thread, a.name, a.step, a.meta, a.clock, buf.name,
                                       sorted(set(units.tolist())), write, tuple(els)))
        a.acc = {}

    def _apply(self, a: _Actor, buf: _Buf, el, write: bool) -> None:
        u = a.thread
        C = a.clock.c
        for t, sh in buf.threads.items():
            if t == u:
                continue
            ct = C.get(t, 0)
            if sh.max_w > ct:
                self._conflicts(sh, sh.w, el, ct, buf, True, a, write)
            if write and sh.max_r > ct:
                self._conflicts(sh, sh.r, el, ct, buf, False, a, write)
        sh = buf.threads.get(u)
        if sh is None:
            sh = buf.threads[u] = _Shadow(buf.nunits)
        e = a.epoch
        if not sh.ids or sh.ids[-1] != a.idx:
            sh.eps.append(e)
            sh.ids.append(a.idx)
        if write:
            sh.w[el] = a.idx
            if sh.max_r:
                sh.r[el] = 0
            if e > sh.max_w:
                sh.max_w = e
        else:
            sh.r[el] = a.idx
            if e > sh.max_r:
                sh.max_r = e

    def _conflicts(self, sh: _Shadow, arr, el, ct, buf, first_write, a, write) -> None:
        seen = sh.last_seen(ct)
        cur = arr[el]
        m = cur > seen  # the stored access is not ordered before this one
        if not bool(m.any()):
            return
        if isinstance(el, slice):
            el = torch.arange(el.start, el.stop, dtype=torch.int64)
        elems = el[m]
        owners = cur[m]
        for o in torch.unique(owners).tolist():
            first = self._actors[o]
            kind = "WAW" if first_write and write else ("RAW" if first_write else "WAR")
            k = (buf.name, o, first_write, a.idx, write)
            f = self._found.get(k)
            if f is None:
                if len(self._found) >= self.max_hazards:
                    self.dropped += 1
                    continue
                f = self._found[k] = _Found(kind, buf, first, first_write, a, write)
            f.elems.append(elems[owners == o])
            self._cache = None

    # -- building reports ---------------------------------------------------------------------
    @staticmethod
    def _side(a: _Actor, write: bool, rows: list[int]) -> Side:
        owners = {}
        mrows = a.meta.get("rows") if a.meta else None
        if isinstance(mrows, dict):
            for r in rows:
                q = mrows.get(r)
                if isinstance(q, str):
                    owners[r] = q
        return Side(a.thread, a.name, a.site, a.step, "write" if write else "read", a.op_id, owners)

    def _build(self, f: _Found) -> Hazard:
        flat = torch.cat(f.elems)
        text, rows = summarize_elements(f.buf.name, f.buf.shape, flat, f.buf.unit)
        n = int(torch.unique(flat).numel()) * f.buf.unit
        return Hazard(f.kind, f.buf.name, text, self._side(f.first, f.fw, rows), self._side(f.second, f.sw, rows),
                      n_elements=n, rows=rows, order=(f.first.key, f.second.key))

    def _stall(self, s: str, t: str, v: int, site: str, step: int) -> Hazard:
        rec = None
        for r in reversed(getattr(self.dev, "ops", ())):
            if r.stream == t and r.clock.get(t) <= v:
                rec = r
                break
        key2 = self.dev._next_id - 0.5
        if rec is not None:
            first = Side(t, rec.name, rec.site, rec.step, "wait", rec.id)
            key1 = float(rec.id)
        else:
            first = Side(t, f"{t} op at epoch {v}", "?", step, "wait")
            key1 = key2
        second = Side(HOST, f"{s}.synchronize", site, step, "wait")
        return Hazard("host-stall", s, "", first, second, order=(key1, key2),
                      detail=f"the {s} stream has waited on {t}-stream work the host has not synchronized "
                             f"with, so the blocking call also waits for it")
