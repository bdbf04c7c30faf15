"""The CUDA device: the stream API on torch.cuda streams and events.

Each named stream is a `torch.cuda.Stream`; `launch` runs its function at once
inside `torch.cuda.stream(s)`, so the host only enqueues and the GPU runs the
work asynchronously; `record` / `wait_event` are `torch.cuda.Event.record` and
`Stream.wait_event`; a host wait is `Event.synchronize()`.

Clock. `host_time()` is wall time in ms since the device was created
(time.perf_counter). Host phases are measured, never charged, so
`_host_advance` does nothing. GPU times come from timing events recorded around
each op and resolved lazily (at host waits, for whatever has already completed,
and at `finish()` / `resolve_times()` for the rest): an anchor event recorded
on an idle GPU at creation, synchronized once, maps the GPU event timer onto
the host clock (`anchor_host_ms + anchor.elapsed_time(e)`). Nothing is
synchronized per op, so the overlap being measured is left alone. The anchor's
error is the record-to-execute latency of one event (microseconds).

Policies. On a real GPU the hardware decides the interleaving; a policy can
only perturb it, never force an order:
- `serial` injects nothing (the streams run as concurrently as the GPU lets them);
- `delay:STREAM:MS` spins `torch.cuda._sleep` for MS ms on STREAM before each op
  launched there (ms are converted to cycles by a one-time calibration);
- `random:SEED` and `pct:SEED:DEPTH` spin seeded random short sleeps
  (0..`jitter_ms`) before ops. `random` draws one per op; `pct` gives each
  stream a random priority (the highest priority sleeps least) and, at DEPTH-1
  seeded change points among the first ops, drops the stream of that op to the
  lowest priority, the way PCT reorders. Both replay the same sleeps for the same
  seed, but not the same interleaving: that still depends on the hardware.

Importing this module makes no CUDA call; constructing a `CudaDevice` without
CUDA raises `harness.device.DeviceError`.
"""
from __future__ import annotations

import contextlib
import random as _random
import time
from collections import deque
from dataclasses import dataclass
from typing import Iterator

import torch

from harness.device.policies import PCT, Delay, Policy, Random, Serial
from harness.device.stream import Device, Event, OpRecord, Stream

NO_CUDA = "no CUDA device: torch.cuda.is_available() is False (use --device sim)"
DEFAULT_JITTER_MS = 0.2  # upper bound of one random / pct sleep

_cycles_per_ms: float | None = None  # the _sleep calibration, once per process


def cuda_unavailable_reason() -> str | None:
    """None when a CUDA device can be used, else a one-line reason."""
    try:
        ok = torch.cuda.is_available()
    except Exception as e:  # a broken driver install
        return f"no CUDA device: torch.cuda.is_available() failed ({e}) (use --device sim)"
    return None if ok else NO_CUDA


def _device_error(msg: str) -> Exception:
    from harness.device import DeviceError  # lazily: harness.device imports this module lazily too
    return DeviceError(msg)


def sleep_cycles_per_ms() -> float:
    """GPU clock cycles of `torch.cuda._sleep` per ms, measured once with timing events."""
    global _cycles_per_ms
    if _cycles_per_ms is None:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            # load the kernel and let the SM clock leave its idle state before timing; the
            # shortest of three runs (the highest clock) errs towards sleeps that are too long
            torch.cuda._sleep(20_000_000)
            best = float("inf")
            for _ in range(3):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(s)
                torch.cuda._sleep(1_000_000)
                b.record(s)
                b.synchronize()
                best = min(best, a.elapsed_time(b))
        _cycles_per_ms = 1_000_000 / max(best, 1e-3)
    return _cycles_per_ms


@dataclass
class SyncDebug:
    """What `sync_debug` yields: whether the mode is on, and if not, why."""

    active: bool
    reason: str = ""


@contextlib.contextmanager
def sync_debug(mode: str | int = "error") -> Iterator[SyncDebug]:
    """Run a block under `torch.cuda.set_sync_debug_mode(mode)` and restore the previous mode.

    With "error", an operation that synchronizes the host with the GPU (a blocking copy,
    `.item()`, `.tolist()` of a device tensor...) raises inside the block. Without CUDA this
    is a no-op that yields `SyncDebug(False, reason)`, so a caller can skip with the reason.
    The mode is process-wide, not per thread."""
    reason = cuda_unavailable_reason()
    if reason is not None:
        yield SyncDebug(False, f"sync debug mode needs CUDA: {reason}")
        return
    prev = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield SyncDebug(True)
    finally:
        torch.cuda.set_sync_debug_mode(prev)


class _Perturb:
    """Sleeps (in ms) to inject on a stream before a launched op, from the policy."""

    def __init__(self, policy: Policy, jitter_ms: float):
        self.policy, self.jitter = policy, float(jitter_ms)
        seed = getattr(policy, "seed", 0)
        # a generator of our own: the policy's is for the sim executor's choices
        self.rng = _random.Random(f"cuda:{policy.spec()}:{seed}")
        self.prio: dict[str, float] = {}
        self.launched = 0
        if isinstance(policy, PCT):
            k = max(0, policy.depth - 1)
            self.changes = sorted(self.rng.sample(range(1, policy.horizon), k)) if k else []
        else:
            self.changes = []

    def active(self) -> bool:
        p = self.policy
        if isinstance(p, Delay):
            return p.amount > 0
        return isinstance(p, (Random, PCT)) and self.jitter > 0

    def before(self, stream: str) -> float:
        p = self.policy
        if isinstance(p, Delay):
            return p.delay_for(stream)
        if isinstance(p, Random):
            return self.rng.random() * self.jitter if self.rng.random() < 0.5 else 0.0
        if isinstance(p, PCT):
            self.launched += 1
            if stream not in self.prio:
                self.prio[stream] = self.rng.random()  # (0, 1]: 1 sleeps least
            if self.changes and self.launched == self.changes[0]:
                self.changes.pop(0)
                self.prio[stream] = 0.0  # lowest: the longest sleeps from here on
            return self.jitter * (1.0 - self.prio[stream])
        return 0.0  # serial and anything unknown: no perturbation


class CudaDevice(Device):
    kind = "cuda"
    torch_device = torch.device("cuda", 0)

    def __init__(self, policy: Policy | None = None, jitter_ms: float = DEFAULT_JITTER_MS, timing: bool = True):
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise _device_error(reason)
        super().__init__()
        self.policy = policy or Serial()
        self.timing = timing  # record a timing-event pair around each op
        self._perturb = _Perturb(self.policy, jitter_ms)
        self._cycles = sleep_cycles_per_ms() if self._perturb.active() else 0.0
        self._cuda_streams: dict[str, torch.cuda.Stream] = {}
        # per stream, in issue order: (rec, start event, end event) whose times are not yet known
        self._pending: dict[str, deque[tuple[OpRecord, torch.cuda.Event, torch.cuda.Event]]] = {}
        with torch.cuda.device(self.torch_device):
            torch.cuda.synchronize()  # an idle GPU, so the anchor runs as soon as it is recorded
            self._t0 = time.perf_counter()
            self._anchor = torch.cuda.Event(enable_timing=True)
            self._anchor.record(torch.cuda.current_stream())
            self._anchor_host_ms = self.host_time()
            self._anchor.synchronize()

    # -- clock -------------------------------------------------------------------
    def host_time(self) -> float:
        return (time.perf_counter() - self._t0) * 1000.0

    def _host_advance(self, cost: float) -> None:
        pass  # real host phases are measured, not charged

    def _gpu_ms(self, e: torch.cuda.Event) -> float:
        return self._anchor_host_ms + self._anchor.elapsed_time(e)

    def resolve_times(self, block: bool = True) -> None:
        """Fill start/end of ops whose timing events have completed (all of them if `block`)."""
        for q in self._pending.values():
            while q:
                rec, a, b = q[0]
                if not b.query():
                    if not block:
                        break
                    b.synchronize()
                rec.start, rec.end = self._gpu_ms(a), self._gpu_ms(b)
                q.popleft()

    def _timed(self, stream: Stream, rec: OpRecord, a: torch.cuda.Event, b: torch.cuda.Event) -> None:
        self._pending.setdefault(stream.name, deque()).append((rec, a, b))

    # -- buffers and streams -------------------------------------------------------
    def alloc(self, name: str, shape, dtype=torch.float32, fill=0) -> torch.Tensor:
        t = super().alloc(name, shape, dtype, fill)
        # the fill ran on the current stream, which our (non-blocking) streams do not order
        # behind; buffers are made at setup, so a sync here costs nothing that is measured
        torch.cuda.current_stream(self.torch_device).synchronize()
        return t

    def stream(self, name: str) -> Stream:
        if name not in self._cuda_streams:
            self._cuda_streams[name] = torch.cuda.Stream(device=self.torch_device)
        return super().stream(name)

    def cuda_stream(self, stream: Stream | str) -> torch.cuda.Stream:
        return self._cuda_streams[stream if isinstance(stream, str) else stream.name]

    def _inject(self, stream: Stream) -> None:
        ms = self._perturb.before(stream.name)
        if ms > 0:
            torch.cuda._sleep(max(1, int(ms * self._cycles)))

    # -- the hooks ------------------------------------------------------------------
    def _do_launch(self, stream, rec, fn, cost):
        s = self.cuda_stream(stream)
        rec.issue_t = self.host_time()
        with torch.cuda.stream(s):
            self._inject(stream)  # the sim's delay_for also lands before the op's start
            if self.timing:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(s)
                self._execute(rec, fn)
                b.record(s)
                self._timed(stream, rec, a, b)
            else:
                self._execute(rec, fn)

    def _do_record(self, stream, ev: Event):
        s = self.cuda_stream(stream)
        rec = ev.rec
        rec.issue_t = self.host_time()
        ce = torch.cuda.Event(enable_timing=self.timing)
        ce.record(s)
        ev.cuda_event = ce
        rec.executed = True  # on a GPU: enqueued
        if self.timing:
            self._timed(stream, rec, ce, ce)

    def _do_wait(self, stream, ev: Event, rec: OpRecord):
        s = self.cuda_stream(stream)
        rec.issue_t = self.host_time()
        if self.timing:  # start: the stream reaches the wait; end: the event is satisfied
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(s)
            s.wait_event(ev.cuda_event)
            b.record(s)
            self._timed(stream, rec, a, b)
        else:
            s.wait_event(ev.cuda_event)
        rec.executed = True

    def _do_host_wait(self, ev: Event):
        ev.cuda_event.synchronize()
        if self.timing:
            self.resolve_times(block=False)  # cheap: pops only what has completed

    def finish(self) -> None:
        super().finish()
        if self.timing:
            self.resolve_times(block=True)
