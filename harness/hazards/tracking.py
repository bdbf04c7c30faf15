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
(`harness.device.clocks.happens_before` on the accessing thread's component: a of thread t happens before
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

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from harness.hazards.report import Hazard, Side, format_hazard, summarize_elements

HOST = "host"
aten = torch.ops.aten
_Tensor = torch.Tensor
# the storage a tensor lives in, as an int: `t.untyped_storage()._cdata` in one C call, without
# making a storage object (raises as untyped_storage() does for a tensor without one)
_sid = torch._C._storage_id
_NO_KW: dict = {}  # the handlers' kwargs when a call has none (never written to)

# indexing ops resolved to the elements they index (through their first argument)
_INDEX_READ = {aten.index, aten.index_select, aten.gather, aten.embedding}
_INDEX_WRITE = {aten.index_copy_, aten.index_put_, aten._index_put_impl_, aten.scatter_, aten.scatter_add_,
                aten.scatter_reduce_}
_INDEXING = _INDEX_READ | _INDEX_WRITE
_INDEXING_OPS: dict[int, bool] = {}  # id(OpOverload) -> is it one of _INDEXING (overloads are never freed)
_INDEX_OP = aten.index.Tensor._op  # the op itself, without OpOverload.__call__'s Python layer


def _indexing(op) -> bool:
    r = _INDEXING_OPS.get(id(op))
    if r is None:
        r = _INDEXING_OPS[id(op)] = op.overloadpacket in _INDEXING
    return r


def _np_units(t: torch.Tensor, unit: int) -> np.ndarray:
    """An integer tensor of element numbers as an int64 array of units (element // unit).
    Units are numpy arrays inside the tracker: an op on a few indices costs about half a torch
    call's, and the shadow state they index is numpy too."""
    a = t.reshape(-1).numpy()
    if a.dtype != np.int64:
        a = a.astype(np.int64)
    return a if unit == 1 else a // unit


class _Buf:
    """A named buffer and its shadow state."""

    __slots__ = ("name", "base", "numel", "shape", "itemsize", "off", "stride", "row_shape", "unit", "nunits",
                 "_flat", "threads")

    def __init__(self, name: str, t: torch.Tensor, row_unit_ndim: int | None):
        self.name, self.base = name, t
        self.numel, self.shape = t.numel(), tuple(t.shape)
        self.itemsize = t.element_size()
        self.off = t.storage_offset()
        self.stride = t.stride()
        self.row_shape = self.shape[1:]
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
        if t.stride() != self.stride or t.shape[1:] != self.row_shape:
            return None
        off = t.storage_offset() - self.off
        return off // u if off % u == 0 else None


class _Shadow:
    """One thread's last write and last read of every unit of a buffer, as access numbers (0:
    none). A read counts only while it is later than the thread's last write of the unit (a
    thread's access numbers grow in check order), so a write need not clear the reads. The
    arrays are numpy: an update is one slice or index assignment, far cheaper than a tensor
    op for the few units an op touches."""

    __slots__ = ("w", "r", "max_w", "max_r", "eps", "ids")

    def __init__(self, n: int):
        self.w = np.zeros(n, dtype=np.int32)
        self.r = np.zeros(n, dtype=np.int32)
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

    __slots__ = ("idx", "thread", "clock", "key", "name", "site", "step", "meta", "op_id", "rd", "wr")

    def __init__(self, idx, thread, clock, key, name, site, step, meta, op_id):
        self.idx, self.thread, self.clock, self.key = idx, thread, clock, key
        self.name, self.site, self.step, self.meta, self.op_id = name, site, step, meta, op_id
        self.rd: dict[_Buf, list] = {}  # buffer -> the units each call read
        self.wr: dict[_Buf, list] = {}  # buffer -> the units each call wrote

    @property
    def epoch(self) -> int:
        return self.clock.get(self.thread)


def _merge(els: list):
    """One op's units of a buffer from its calls' parts (slices, int64 arrays): one slice when the
    slices cover one run, a tuple of slices when they are all slices, else one array."""
    if all(type(e) is slice for e in els):
        runs = sorted(els, key=lambda e: e.start)
        lo, hi = runs[0].start, runs[0].stop
        for e in runs[1:]:
            if e.start > hi:
                return tuple(els)
            if e.stop > hi:
                hi = e.stop
        return slice(lo, hi)
    return _as_array(tuple(els))


def _as_array(el) -> np.ndarray:
    """Units as an int64 array: from a slice, an array, or a tuple of either."""
    if type(el) is slice:
        return np.arange(el.start, el.stop, dtype=np.int64)
    if type(el) is tuple:
        return np.concatenate([np.arange(e.start, e.stop, dtype=np.int64) if type(e) is slice else e for e in el])
    return el


def _part(el):
    """A part as Access.parts gives it: a slice or a LongTensor."""
    return el if type(el) is slice else torch.from_numpy(el)


class _Found:
    __slots__ = ("kind", "buf", "first", "fw", "second", "sw", "elems")

    def __init__(self, kind, buf, first, fw, second, sw):
        self.kind, self.buf, self.first, self.fw, self.second, self.sw = kind, buf, first, fw, second, sw
        self.elems: list[np.ndarray] = []


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
            # does any tensor argument live in a named buffer's storage? (rare here: the
            # pre-filter records the common calls itself)
            found = _found(self.tracker, info, args, kwargs)
            if found is not None:
                self.tracker._on_call(func, found, args, kwargs)
        return func._op(*args, **kwargs)


_push_dispatch = torch._C._push_on_torch_dispatch_stack
_pop_dispatch = torch._C._pop_torch_dispatch_stack


# argument types that are never a tensor nor hold one: a list or tuple of only these (a shape, a
# pad) needs no scan (one C-level pass over the types)
_PLAIN = frozenset((int, float, bool, complex, str, type(None), torch.device, torch.dtype, torch.layout,
                    torch.memory_format, torch.Size))


def _touches(by: dict, seq) -> bool:
    """Does any tensor in `seq` (or in a list / tuple in it) live in a named buffer's storage?"""
    for x in seq:
        if isinstance(x, _Tensor):
            try:
                if _sid(x) in by:
                    return True
            except (RuntimeError, NotImplementedError):
                pass
        elif isinstance(x, (list, tuple)):
            for y in x:
                if isinstance(y, _Tensor):
                    try:
                        if _sid(y) in by:
                            return True
                    except (RuntimeError, NotImplementedError):
                        pass
    return False


class _Filter(TorchFunctionMode):
    """A cheap pre-filter: a torch function none of whose arguments is (a view of) a named
    buffer cannot touch one, so only the others run under the dispatch mode. This keeps
    the per-call cost of the dispatch mode off the model's arithmetic on weights and
    temporaries. (A torch function only reaches tensors through its arguments.)

    The calls the engine makes most often skip the dispatch mode too (`_FAST`): views and
    metadata (basic indexing, `.view`, `.T`, `.shape`) touch nothing, and `copy_`,
    `t[i] = v`, `index_select`, `index_copy_`, `clone`, ... are each one aten call whose
    accesses are recorded here exactly as the dispatch mode would record them
    (`prefilter=False` runs everything under the dispatch mode; a test compares the logs)."""

    def __init__(self, tracker: "AccessTracker"):
        super().__init__()
        self.tracker = tracker

    def __torch_function__(self, func, types, args=(), kwargs=None):
        try:
            fast = _FAST.get(func)
        except TypeError:  # an unhashable callable
            fast = None
        if fast is not None:
            if fast is _VIEW:
                return func(*args, **kwargs) if kwargs else func(*args)
            if fast is _getitem and not kwargs and len(args) == 2:
                idx = args[1]  # a basic index makes a view: nothing to record (x[a:b] inline)
                if type(idx) is slice:
                    if type(idx.start) in _BOUND and type(idx.stop) in _BOUND and type(idx.step) in _BOUND:
                        return func(*args)
                elif _basic_index(idx):
                    return func(*args)
            r = fast(self.tracker, func, args, kwargs or _NO_KW)
            if r is not _GENERIC:
                return r
        by = self.tracker._by_storage
        hit = False
        for x in args:  # _touches, inlined for the common case of plain tensor arguments
            if isinstance(x, _Tensor):
                try:
                    if _sid(x) in by:
                        hit = True
                        break
                except (RuntimeError, NotImplementedError):
                    pass
            elif isinstance(x, (list, tuple)) and not _PLAIN.issuperset(map(type, x)) and _touches(by, x):
                hit = True
                break
        if hit or (kwargs and not _PLAIN.issuperset(map(type, kwargs.values())) and _touches(by, kwargs.values())):
            tr = self.tracker
            if not tr._mode_flags:
                # the dispatch mode's flags are set (its __enter__) on an op's first such call,
                # and stay set until the op ends; the mode itself is on the stack for this call
                # only (the raw push / pop is cheap)
                tr._mode.__enter__()
                _pop_dispatch(None)
                tr._mode_flags = True
            _push_dispatch(tr._mode)
            try:
                return func(*args, **kwargs) if kwargs else func(*args)
            finally:
                _pop_dispatch(None)
        return func(*args, **kwargs) if kwargs else func(*args)


# -- fast paths of the filter -------------------------------------------------------------------
# A handler gets (tracker, func, args, kwargs), records what the dispatch mode would record for
# the call, and returns the call's result; or returns _GENERIC, having done nothing, to leave the
# call to the generic path (the argument scan, then the dispatch mode).
_VIEW = object()  # the call only makes a view or reads metadata: no access
_GENERIC = object()


def _basic_index(idx) -> bool:
    """An index of ints, int slices, None and Ellipsis: a view (slice / select / unsqueeze) that
    reads no tensor. Anything else (tensors, bools, lists) is advanced indexing."""
    t = type(idx)
    if t is slice:
        return type(idx.start) in _BOUND and type(idx.stop) in _BOUND and type(idx.step) in _BOUND
    if t is tuple:
        for i in idx:
            t = type(i)
            if t is slice:
                if not (type(i.start) in _BOUND and type(i.stop) in _BOUND and type(i.step) in _BOUND):
                    return False
            elif t not in _ITEM:
                return False
        return True
    return t in _ITEM


_BOUND = frozenset((int, type(None)))  # a basic slice's start / stop / step
_ITEM = frozenset((int, type(None), type(Ellipsis)))  # the other items of a basic index


def _tensor_index(idx):
    """The index tensors of `t[idx]` when it is one aten.index call over them: integer tensors of
    one or more dims, alone or in a tuple of only such tensors; else None."""
    ts = idx if type(idx) is tuple else (idx,)
    for i in ts:
        if not isinstance(i, torch.Tensor) or i.dim() == 0 or i.dtype in (torch.bool, torch.uint8) \
                or i.is_floating_point():
            return None
    return list(ts)


def _found(tr, op_info, args, kwargs):
    """What the dispatch mode's scan finds for one call of an aten op with these arguments:
    [(position, tensor, buffer, is_write)] or None."""
    by = tr._by_storage
    found = None
    n = len(args)
    for i, name, w, is_list in op_info:
        v = args[i] if i < n else kwargs.get(name)
        if v is None:
            continue
        if not is_list:
            if isinstance(v, _Tensor):
                try:
                    b = by.get(_sid(v))
                except (RuntimeError, NotImplementedError):
                    continue
                if b is not None:
                    if found is None:
                        found = []
                    found.append((i, v, b, w))
            continue
        for t in v:
            if isinstance(t, _Tensor):
                try:
                    b = by.get(_sid(t))
                except (RuntimeError, NotImplementedError):
                    continue
                if b is not None:
                    if found is None:
                        found = []
                    found.append((i, t, b, w))
    return found


def _direct(op, out_op=None, positional: int = 0):
    """A handler for a torch function that is the one aten call `op` (`out_op` with an out=
    tensor) with the same arguments. Keyword arguments must carry the schema's names when they
    hold a tensor; indexing ops need their first `positional` arguments given by position."""
    infos = {False: _func_info(op), True: _func_info(out_op) if out_op is not None else None}
    names = {k: {n for _, n, _, _ in v} for k, v in infos.items() if v is not None}

    def handler(tr, func, args, kwargs):
        if kwargs:
            has_out = "out" in kwargs
            info = infos[has_out]
            if info is None:
                return _GENERIC  # an out= form we do not know
            known = names[has_out]
            for k, v in kwargs.items():
                if k not in known and isinstance(v, (_Tensor, list, tuple)):
                    return _GENERIC
        else:
            has_out, info = False, infos[False]
            if info is None:
                return _GENERIC
        if len(args) < positional or (positional > 1 and type(args[1]) is not int):
            return _GENERIC  # a named dim, ...
        found = _found(tr, info, args, kwargs)
        if found is not None:
            tr._on_call(out_op if has_out else op, found, args, kwargs)
        return func(*args, **kwargs) if kwargs else func(*args)
    return handler


def _getitem(tr, func, args, kwargs):
    if len(args) != 2 or kwargs:
        return _GENERIC
    t, idx = args
    if _basic_index(idx):
        return func(t, idx)  # a view: nothing to record
    ts = _tensor_index(idx)
    if ts is None:
        return _GENERIC
    found = _found(tr, _INDEX_INFO, (t, ts), _NO_KW)
    if found is not None:
        tr._on_call(aten.index.Tensor, found, (t, ts), _NO_KW)
    return func(t, idx)


def _copy(tr, func, args, kwargs):
    """Tensor.copy_(src, non_blocking=False): aten.copy_ writes self and reads src."""
    if not 2 <= len(args) <= 3 or (kwargs and (len(kwargs) > 1 or "non_blocking" not in kwargs)):
        return _GENERIC
    dst, src = args[0], args[1]
    if not isinstance(src, _Tensor):
        return _GENERIC
    by = tr._by_storage
    try:
        bd = by.get(_sid(dst))
        bs = by.get(_sid(src))
    except (RuntimeError, NotImplementedError, TypeError):
        return _GENERIC
    if bd is not None or bs is not None:
        a = tr._actor()
        if bd is not None:
            tr._record(a, bd, dst, True)
        if bs is not None:
            tr._record(a, bs, src, False)
    return func(*args, **kwargs) if kwargs else func(*args)


def _setitem(tr, func, args, kwargs):
    """t[idx] = v with a basic index: copy_ (or fill_) into the view t[idx], reading v."""
    if len(args) != 3 or kwargs or not _basic_index(args[1]):
        return _GENERIC
    t, idx, v = args
    if isinstance(v, _Tensor):
        bv = tr._resolve(v)
    elif type(v) in (int, float, bool):
        bv = None
    else:
        return _GENERIC
    bt = tr._resolve(t)
    if bt is not None or bv is not None:
        a = tr._actor()
        if bt is not None:
            tr._record(a, bt, t[idx], True)
        if bv is not None:
            tr._record(a, bv, v, False)
    return func(t, idx, v)


def _reshape(tr, func, args, kwargs):
    """A view when the strides allow one (nothing recorded), else a copy: aten.clone reads `t`."""
    t = args[0]
    b = tr._resolve(t)
    out = func(*args, **kwargs) if kwargs else func(*args)
    if b is not None and isinstance(out, _Tensor) and _sid(out) != _sid(t):
        tr._on_call(aten.clone.default, [(0, t, b, False)], (t,), _NO_KW)
    return out


_INDEX_INFO = _func_info(aten.index.Tensor)
_T = torch._C.TensorBase
_FAST: dict = {
    _T.__getitem__: _getitem,
    _T.__setitem__: _setitem,
    _T.copy_: _copy,
    _T.index_select: _direct(aten.index_select.default, aten.index_select.out, positional=3),
    torch.index_select: _direct(aten.index_select.default, aten.index_select.out, positional=3),
    _T.index_copy_: _direct(aten.index_copy_.default, positional=4),
    _T.clone: _direct(aten.clone.default),
    _T.zero_: _direct(aten.zero_.default),
    _T.add: _direct(aten.add.Tensor),
    torch.argmax: _direct(aten.argmax.default),
    _T.argmax: _direct(aten.argmax.default),
    torch.log_softmax: _direct(aten._log_softmax.default),
    _T.reshape: _reshape,
}
for _f in (_T.view, _T.view_as, _T.transpose, _T.permute, _T.expand, _T.unsqueeze, _T.t, _T.numel, _T.size,
           _T.dim, _T.stride, _T.storage_offset, _T.is_contiguous, _T.element_size, _T.data_ptr):
    _FAST[_f] = _VIEW
for _name in ("shape", "dtype", "device", "ndim", "layout", "itemsize", "nbytes", "T", "mT", "data",
              "requires_grad", "is_leaf", "grad_fn", "_base", "is_cpu", "is_cuda", "is_meta"):
    _FAST[_T.__dict__[_name].__get__] = _VIEW


class _Executing:
    __slots__ = ("tracker", "rec")

    def __init__(self, tracker: "AccessTracker", rec):
        self.tracker, self.rec = tracker, rec

    def __enter__(self):
        tr = self.tracker
        tr._cur, tr._cur_actor = self.rec, None
        if tr._filter is not None:
            # only the calls the filter lets through run under the dispatch mode (it enters the
            # mode on the op's first such call: most ops have none)
            tr._mode_flags = False
            tr._filter.__enter__()
        else:
            tr._mode.__enter__()
        return self

    def __exit__(self, *exc):
        tr = self.tracker
        if tr._filter is not None:
            tr._filter.__exit__(*exc)
            if tr._mode_flags:
                _push_dispatch(tr._mode)
                tr._mode.__exit__(*exc)
                tr._mode_flags = False
        else:
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
        self._mode_flags = False  # the dispatch mode entered (its flags set) for the running op
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
            key = _sid(t)
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
        (a.wr if write else a.rd)[buf] = [el]
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
        if not isinstance(t, _Tensor):
            return None
        try:
            return self._by_storage.get(_sid(t))
        except (RuntimeError, NotImplementedError):
            return None

    def _elements(self, buf: _Buf, t: torch.Tensor):
        """The units of `buf` that view `t` covers: a slice, a 1-D int64 array, or None (empty)."""
        n = t.numel()
        if n == 0:
            return None
        if t.element_size() != buf.itemsize:
            return slice(0, buf.nunits)
        off = t.storage_offset() - buf.off
        u = buf.unit
        if t.is_contiguous():
            lo, hi = off, off + n
            if lo < 0:
                lo = 0
            if hi > buf.numel:
                hi = buf.numel
            if hi <= lo:
                return None
            return slice(lo, hi) if u == 1 else slice(lo // u, -(-hi // u))
        try:
            flat = buf.flat.as_strided(t.shape, t.stride(), off)
        except RuntimeError:
            return slice(0, buf.nunits)
        return _np_units(flat, u)

    def _actor(self) -> _Actor:
        """The running op's actor (made on its first access)."""
        a = self._cur_actor
        if a is None:
            r = self._cur
            a = self._cur_actor = self._new_actor(r.stream, r.clock, float(r.id), r.name, r.site, r.step,
                                                  r.meta, r.id)
        return a

    def _record(self, a: _Actor, b: _Buf, t: torch.Tensor, w: bool) -> None:
        """One access of a call that is not an indexing op: the units view `t` covers."""
        el = self._elements(b, t)
        if el is None:
            return
        acc = a.wr if w else a.rd
        lst = acc.get(b)
        if lst is None:
            acc[b] = [el]
        else:
            lst.append(el)

    def _on_call(self, func, found, args, kwargs) -> None:
        """Record an aten call's accesses: found = [(argument position, tensor, buffer, is_write)]."""
        a = self._actor()
        for i, t, b, w in found:
            el = None
            if i == 0 and self.precise_indices and _indexing(func):
                el = self._precise(func.overloadpacket, b, t, args, kwargs)
                if el is not None and el.size == 0:
                    continue
            if el is None:
                el = self._elements(b, t)
                if el is None:
                    continue
            acc = a.wr if w else a.rd
            lst = acc.get(b)
            if lst is None:
                acc[b] = [el]
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
                return self._units(buf, _INDEX_OP(m, [None if x is None else x.cpu() for x in idx]))
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
        n0 = t.shape[0]
        if not n0:
            return None
        r0 = buf.rows_view(t)
        if not index.is_cpu:
            index = index.cpu()
        # negative indices count from the end (and a fresh array: the op's own index tensor may
        # be rewritten later); an index out of range fails the op itself. The remainder (an
        # integer division per index) only when some index is negative
        idx = index.numpy().reshape(-1)
        if idx.size and idx.min() < 0:
            idx = np.remainder(idx, n0, dtype=np.int64)
        else:
            idx = idx.astype(np.int64)  # a copy
        if r0 is None:
            # a contiguous view that cuts whole rows into shorter ones (the KV pool as
            # [slots * kv_heads, head_dim], which attention gathers head-major): the unit of
            # each indexed row, without mapping every element
            n = t.numel() // n0
            off = t.storage_offset() - buf.off
            if (not n or not t.is_contiguous() or t.element_size() != buf.itemsize or buf.unit % n
                    or off % n):
                return None
            # (off + idx * n) // unit, with n dividing both off and unit
            if off:
                idx += off // n
            k = buf.unit // n
            if k != 1:
                if k & (k - 1):
                    idx //= k
                else:  # a power of two (the KV heads per slot): a shift, as the indices are >= 0
                    idx >>= k.bit_length() - 1
            return idx
        if r0:
            idx += r0
        return idx

    def _index_map(self, buf: _Buf, t: torch.Tensor):
        if t.element_size() != buf.itemsize:
            return None
        try:
            return buf.flat.as_strided(t.shape, t.stride(), t.storage_offset() - buf.off)
        except RuntimeError:
            return None

    @staticmethod
    def _units(buf: _Buf, flat: torch.Tensor) -> np.ndarray:
        return _np_units(flat, buf.unit)

    # -- the check ------------------------------------------------------------------------
    def _apply_actor(self, a: _Actor) -> None:
        # reads first, then writes: an op that reads and writes an element counts as its writer
        e = a.clock.get(a.thread)
        for write, acc in ((False, a.rd), (True, a.wr)):
            for buf, els in acc.items():
                el = els[0] if len(els) == 1 else _merge(els)
                self._apply(a, e, buf, el, write)
                if self.log_prefixes and buf.name.startswith(self.log_prefixes):
                    units = _as_array(el)
                    self.log.append(Access(a.op_id, a.thread, a.name, a.step, a.meta, a.clock, buf.name,
                                           sorted(set(units.tolist())), write, tuple(_part(x) for x in els)))
        a.rd = a.wr = None  # checked: nothing more is recorded for it

    def _apply(self, a: _Actor, e: int, buf: _Buf, el, write: bool) -> None:
        """Check one access (`el` units of `buf`, at epoch `e` of its thread) against the shadow
        state of the other threads, then record it in its own thread's."""
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
        i = a.idx
        ids = sh.ids
        if not ids or ids[-1] != i:
            sh.eps.append(e)
            ids.append(i)
        arr = sh.w if write else sh.r
        if type(el) is tuple:  # runs with gaps between them: a slice assignment each
            for s in el:
                arr[s] = i
        else:  # a slice or an array of units
            arr[el] = i
        if write:
            if e > sh.max_w:
                sh.max_w = e
        elif e > sh.max_r:
            sh.max_r = e

    def _conflicts(self, sh: _Shadow, arr, el, ct, buf, first_write, a, write) -> None:
        seen = sh.last_seen(ct)
        if type(el) is tuple:
            el = _as_array(el)
        cur = arr[el]
        if not first_write:  # a read the thread's own later write superseded does not count
            cur = np.where(cur > sh.w[el], cur, 0)
        m = cur > seen  # the stored access is not ordered before this one
        if not m.any():
            return
        if type(el) is slice:
            el = np.arange(el.start, el.stop, dtype=np.int64)
        elems = el[m]
        owners = cur[m]
        for o in np.unique(owners).tolist():
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
        flat = torch.from_numpy(np.concatenate(f.elems))
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
