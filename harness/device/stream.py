"""The stream API that the engine is written against (DESIGN.md, "The stream model").

Two implementations share this bookkeeping: `sim` (a deterministic executor with
a virtual clock) and `cuda` (torch.cuda streams and events). The base keeps what
both need for reports and hazard detection: every op's issue site, its step,
and its vector clock in program order.
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from harness.device.clocks import VectorClock

HOST = "host"
_HERE = os.path.dirname(os.path.abspath(__file__))


_SHOWN: dict[str, str | None] = {}  # code file -> its name in reports, None inside the device layer


def _shown(fn: str) -> str | None:
    # cached per file: path arithmetic on every launch was a tenth of a tiny-model step
    if fn not in _SHOWN:
        root = os.path.dirname(os.path.dirname(_HERE))
        _SHOWN[fn] = (None if os.path.dirname(os.path.abspath(fn)) == _HERE
                      else os.path.relpath(fn, root) if fn.startswith(root) else fn)
    return _SHOWN[fn]


def issue_site() -> str:
    """file:line of the first frame outside the device layer: where the engine issued the op."""
    f = sys._getframe(1)
    while f is not None and _shown(f.f_code.co_filename) is None:
        f = f.f_back
    if f is None:
        return "?"
    return f"{_shown(f.f_code.co_filename)}:{f.f_lineno}"


@dataclass
class OpRecord:
    """One op as the timeline and the hazard detector see it."""

    id: int
    stream: str
    name: str
    kind: str  # "kernel" | "copy" | "record" | "wait" | "sync"
    site: str
    step: int
    clock: VectorClock
    issue_t: float = 0.0
    start: float = 0.0
    end: float = 0.0
    meta: dict = field(default_factory=dict)
    executed: bool = False


@dataclass
class HostSpan:
    """A host phase (prepare / launch / process) or a host wait, in the same clock as ops."""

    name: str
    step: int
    start: float
    end: float
    site: str = ""
    stream: str = ""  # for waits: what the host waited on
    seq: int = -1  # ops issued before the span began: places it in program order among the ops
    event: int | None = None  # for waits: the record op of the event waited on


class Event:
    def __init__(self, device: "Device", stream: "Stream", name: str):
        self.device = device
        self.stream = stream
        self.name = name
        self.clock = VectorClock()
        self.rec: OpRecord | None = None

    def synchronize(self) -> None:
        """The host waits until the device reaches this event."""
        self.device._host_wait_event(self)


class Stream:
    def __init__(self, device: "Device", name: str):
        self.device = device
        self.name = name
        self.clock = VectorClock()

    # -- the API -------------------------------------------------------------
    def launch(self, name: str, fn: Callable[[], Any], cost: float = 0.0, meta: dict | None = None,
               kind: str = "kernel") -> OpRecord:
        """Queue `fn` on this stream; `cost` is its virtual duration in ms (sim only)."""
        return self.device._launch(self, name, fn, cost, meta or {}, kind)

    def record(self, name: str = "event") -> Event:
        return self.device._record(self, name)

    def wait_event(self, ev: Event) -> None:
        self.device._wait_event(self, ev)

    def wait_stream(self, other: "Stream") -> None:
        self.wait_event(other.record(f"{other.name}.tail"))

    def copy_to_host(self, name: str, src: torch.Tensor, dst: torch.Tensor, cost: float = 0.0) -> Event:
        """Copy a device buffer into a pinned host buffer without blocking the host;
        the returned copy-done event is what the host must wait on before reading `dst`."""
        self.launch(name, lambda: dst.copy_(src, non_blocking=True), cost=cost, kind="copy")
        return self.record(f"{name}.done")

    def synchronize(self) -> None:
        """A blocking call: the host waits for everything queued on this stream so far."""
        self.device._host_wait_event(self.record(f"{self.name}.sync"), blocking_call=True)


class Device:
    """Common bookkeeping; subclasses implement the _do_* hooks."""

    kind = "base"

    def __init__(self):
        self.streams: dict[str, Stream] = {}
        self.host_clock = VectorClock()
        self.ops: list[OpRecord] = []
        self.host_spans: list[HostSpan] = []
        self.buffers: dict[str, torch.Tensor] = {}
        self.step = 0
        self.tracker = None  # a harness.hazards tracker, when one is attached
        self.keep_ops = True  # records for timelines and summaries; a long-lived server turns it off
        self._next_id = 0

    # -- buffers -------------------------------------------------------------
    def alloc(self, name: str, shape, dtype=torch.float32, fill=0) -> torch.Tensor:
        """A named, preallocated device buffer (the hazard detector reports by these names)."""
        t = torch.full(tuple(shape), fill, dtype=dtype, device=self.torch_device)
        self.buffers[name] = t
        return t

    def pinned(self, name: str, shape, dtype=torch.float32) -> torch.Tensor:
        t = torch.zeros(tuple(shape), dtype=dtype, pin_memory=self.kind == "cuda")
        self.buffers[name] = t
        return t

    def from_host(self, values, dtype=torch.int64) -> torch.Tensor:
        """A host tensor holding `values`, for an op to copy to the device. On CUDA it is
        pinned, so the copy (non_blocking) does not make the host wait for the stream."""
        t = torch.tensor(values, dtype=dtype)
        return t.pin_memory() if self.kind == "cuda" else t

    def stream(self, name: str) -> Stream:
        if name not in self.streams:
            self.streams[name] = Stream(self, name)
        return self.streams[name]

    def set_step(self, step: int) -> None:
        self.step = step

    # -- host side -----------------------------------------------------------
    def host_access(self, name: str, t: torch.Tensor, write: bool = False) -> None:
        """Tell the tracker that the host reads (or writes) a host buffer now."""
        self.host_clock.tick(HOST)
        if self.tracker is not None:
            self.tracker.host_access(name, t, write, self.host_clock.copy(), issue_site(), self.step)

    @contextlib.contextmanager
    def host_phase(self, name: str, cost: float = 0.0) -> Iterator[None]:
        """A span of host work (prepare / launch / process); `cost` is its virtual ms in the sim."""
        start, seq = self.host_time(), self._next_id
        yield
        self._host_advance(cost)
        if self.keep_ops:
            self.host_spans.append(HostSpan(name, self.step, start, self.host_time(), seq=seq))

    def synchronize(self) -> None:
        for s in list(self.streams.values()):
            self._host_wait_event(s.record(f"{s.name}.devsync"))

    # -- shared bookkeeping ----------------------------------------------------
    def _new_record(self, stream: Stream, name: str, kind: str, meta: dict) -> OpRecord:
        self.host_clock.tick(HOST)
        stream.clock.join(self.host_clock)  # everything the host did before issuing is ordered before
        stream.clock.tick(stream.name)
        rec = OpRecord(self._next_id, stream.name, name, kind, issue_site(), self.step, stream.clock.copy(),
                       meta=meta)
        self._next_id += 1
        if self.keep_ops:
            self.ops.append(rec)
        return rec

    def _launch(self, stream, name, fn, cost, meta, kind) -> OpRecord:
        rec = self._new_record(stream, name, kind, meta)
        self._do_launch(stream, rec, fn, cost)
        return rec

    def _record(self, stream: Stream, name: str) -> Event:
        ev = Event(self, stream, name)
        ev.rec = self._new_record(stream, name, "record", {})
        ev.clock = stream.clock.copy()
        self._do_record(stream, ev)
        return ev

    def _wait_event(self, stream: Stream, ev: Event) -> None:
        rec = self._new_record(stream, f"wait:{ev.name}", "wait", {"event": ev.rec.id if ev.rec else None})
        stream.clock.join(ev.clock)
        self._do_wait(stream, ev, rec)

    def _host_wait_event(self, ev: Event, blocking_call: bool = False) -> None:
        site = issue_site()
        start, seq = self.host_time(), self._next_id
        self._do_host_wait(ev)
        self.host_clock.join(ev.clock)
        self.host_clock.tick(HOST)
        if self.keep_ops or blocking_call:
            self.host_spans.append(HostSpan("blocking-call" if blocking_call else "wait", self.step, start,
                                            self.host_time(), site, ev.stream.name, seq,
                                            ev.rec.id if ev.rec is not None else None))
        if self.tracker is not None:
            self.tracker.host_sync(ev, blocking_call, site, self.step)

    def _execute(self, rec: OpRecord, fn: Callable[[], Any]) -> None:
        if self.tracker is not None:
            with self.tracker.executing(rec):
                fn()
        else:
            fn()
        rec.executed = True

    # -- implemented by sim and cuda -------------------------------------------
    torch_device: torch.device = torch.device("cpu")

    def host_time(self) -> float:
        raise NotImplementedError

    def _host_advance(self, cost: float) -> None:
        raise NotImplementedError

    def _do_launch(self, stream: Stream, rec: OpRecord, fn, cost: float) -> None:
        raise NotImplementedError

    def _do_record(self, stream: Stream, ev: Event) -> None:
        raise NotImplementedError

    def _do_wait(self, stream: Stream, ev: Event, rec: OpRecord) -> None:
        raise NotImplementedError

    def _do_host_wait(self, ev: Event) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Run everything still queued (end of a run)."""
        self.synchronize()
