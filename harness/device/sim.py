"""The simulated device: streams are queues of ops run by a deterministic executor.

Virtual time is computed when an op is issued (its start is the latest of its
issue time, its stream's previous op and the events it waits on), so the
step timings do not depend on the policy's choice of execution order; the
data effects do. The same policy and seed give the same execution, bit for bit.
"""
from __future__ import annotations

from collections import deque

import torch

from harness.device.policies import Policy, Serial
from harness.device.stream import Device, Event, OpRecord, Stream


class _Pending:
    __slots__ = ("rec", "fn", "dep")

    def __init__(self, rec: OpRecord, fn, dep: OpRecord | None):
        self.rec, self.fn, self.dep = rec, fn, dep


class SimDevice(Device):
    kind = "sim"
    torch_device = torch.device("cpu")

    def __init__(self, policy: Policy | None = None, launch_overhead: float = 0.0):
        super().__init__()
        self.policy = policy or Serial()
        self.launch_overhead = launch_overhead  # virtual host ms per launched op
        self.t = 0.0
        self.queues: dict[str, deque[_Pending]] = {}
        self.free_at: dict[str, float] = {}

    # -- virtual clock -------------------------------------------------------
    def host_time(self) -> float:
        return self.t

    def _host_advance(self, cost: float) -> None:
        self.t += cost
        self._progress()

    def _enqueue(self, stream: Stream, p: _Pending) -> None:
        self.queues.setdefault(stream.name, deque()).append(p)

    def _do_launch(self, stream, rec, fn, cost):
        self.t += self.launch_overhead
        rec.issue_t = self.t
        rec.start = max(self.t, self.free_at.get(stream.name, 0.0)) + self.policy.delay_for(stream.name)
        rec.end = rec.start + cost
        self.free_at[stream.name] = rec.end
        self._enqueue(stream, _Pending(rec, fn, None))
        self._progress()

    def _do_record(self, stream, ev: Event):
        rec = ev.rec
        rec.issue_t = self.t
        rec.start = rec.end = max(self.t, self.free_at.get(stream.name, 0.0))
        self._enqueue(stream, _Pending(rec, None, None))
        self._progress()

    def _do_wait(self, stream, ev: Event, rec: OpRecord):
        t = max(self.free_at.get(stream.name, 0.0), ev.rec.end)  # an event's time is its record's end
        rec.issue_t, rec.start, rec.end = self.t, t, t
        self.free_at[stream.name] = t
        self._enqueue(stream, _Pending(rec, None, ev.rec))
        self._progress()

    def _do_host_wait(self, ev: Event):
        while not ev.rec.executed:
            ready = self._ready()
            assert ready, "sim deadlock: nothing ready but the event is not reached"
            self._run(self.policy.pick(ready))
        self.t = max(self.t, ev.rec.end)
        self._progress()

    # -- the executor ----------------------------------------------------------
    def _ready(self) -> list[_Pending]:
        out = []
        for q in self.queues.values():
            if q and (q[0].dep is None or q[0].dep.executed):
                out.append(q[0])
        return out

    def _run(self, p: _Pending) -> None:
        self.queues[p.rec.stream].popleft()
        if p.fn is not None:
            self._execute(p.rec, p.fn)
        else:
            p.rec.executed = True

    def _progress(self) -> None:
        """Let the device run at a host interaction that does not block."""
        pol = self.policy
        if pol.time_ordered:
            while True:
                ready = [p for p in self._ready() if p.rec.start <= self.t]
                if not ready:
                    return
                self._run(pol.pick(ready))
        n = pol.budget()
        while n != 0:
            ready = self._ready()
            if not ready:
                return
            self._run(pol.pick(ready))
            n -= 1
