"""Overlap judged by what a served engine's host did, in time order (issue 17, item 1).

The shape of a batch queue says nothing: a loop that waits for the batch in flight before it
schedules the next one keeps a queue of two and loses the overlap. What decides it, as the ref
engine's oracle (harness.oracles.overlap.early_waits) decides it for the sim, is the order of two host
events: the engine core starting to schedule step N+1, and the engine core waiting on step N's
result.

The agent inside the engine records those events (`time.monotonic_ns`: one system-wide clock on
Linux, comparable across processes) into a `HostOrder`: the last RING events are kept for the
report, and each wait is classified online, so memory stays bounded however long the server
runs:

- overlapped: when the host began waiting on step N, a later non-empty batch was already
  scheduled (step N+1 was prepared while step N was in flight);
- early: no later batch was scheduled before the wait, and the next batch scheduled after it
  continues a request of step N. Async scheduling schedules a running decode with a
  placeholder for the token step N has not yet delivered, so that batch could have been
  scheduled before the wait: the host waited first;
- one batch only: neither (the last step of a burst, a next batch of new requests only, the
  start-up): nothing else was there to overlap with, and it does not count against overlap.

The rule: overlap is LOST when more than EARLY_FRACTION of the judged waits (overlapped +
early) were early, with at least MIN_JUDGED judged waits; a run that delivered no token is
never judged effective.

The same order is judged per request too (issue 36, item 4), because a run can overlap on every
path but one: a wait on step N whose batch a request was in is, for that request,
- overlapped: a later batch scheduled before the wait already continued it;
- early: no later batch before the wait continued it, although each one scheduled before the
  wait had room (token budget and a slot left), no pause held the engine, and the first batch
  scheduled after the wait continues it, unpreempted. A request the engine could have scheduled
  ahead, and scheduled only once step N's result was in;
- neither: it did not continue in that next batch (finished, aborted, preempted), or a later
  batch before the wait was full (the budget went to others: nothing was held back).
The agent hands each request's verdict to a callback (the request's steps books), and the
harness sums them by path. This module is imported inside the engine's processes: stdlib only.
"""
from __future__ import annotations

import time
from collections import deque

RING = 4096  # events kept per engine core process (for the report; the counts are online)
EARLY_FRACTION = 0.25  # more early waits than this fraction of the judged ones: overlap LOST
MIN_JUDGED = 4  # fewer judged waits: not judged (a run that is all start-up and tail)
COUNTS = ("scheduled", "waits", "overlapped", "early", "single", "wait_ns")


class HostOrder:
    """The engine core's schedule and wait events, classified as they happen (one thread)."""

    def __init__(self, ring: int = RING):
        self.events: deque = deque(maxlen=ring)  # (kind, step, t_ns, n)
        self.counts = dict.fromkeys(COUNTS, 0)
        self.inflight: dict[int, frozenset] = {}  # scheduled non-empty batches not yet waited on
        self.candidate: frozenset | None = None  # requests of a wait that came before any later batch
        self.next_step = 0
        self._wait_t: dict[int, int] = {}
        # per request (issue 36, item 4): whether each in-flight batch had room for one more
        # request, and the requests of a wait that no earlier-scheduled batch continued
        self.on_request = None  # fn(request id, "overlapped" | "early", "prefill" | "decode"), set by the agent
        self.room: dict[int, bool] = {}
        self.prefills: dict[int, frozenset] = {}  # step -> its requests with more than one token (a prefill)
        self.pending: dict = {}  # request id -> (the later batches before its wait all had room, phase)
        self.preempted: set = set()  # preempted while a step of theirs was in flight
        self.paused = False  # the last schedule found the engine paused
        self.max_in_flight = 0  # the most non-empty batches scheduled and not yet waited on, at once

    def _verdict(self, rid, kind: str, phase: str) -> None:
        if self.on_request is not None:
            self.on_request(rid, kind, phase)

    def scheduled(self, req_ids, tokens: int, t: int, room: bool = True, preempted=(),
                  paused: bool = False, prefills=()) -> int | None:
        """The host scheduled a batch with these requests, starting at `t` (monotonic_ns taken
        before scheduling began); returns the batch's step number, None for an empty batch.
        `room`: the batch left token budget and a slot unused; `preempted`: the requests this
        schedule (or a reset since the last one) preempted; `paused`: the engine is paused;
        `prefills`: the requests given more than one token (a prompt or a chunk of one): a wait on
        their step is judged as a prefill's (a chunked prefill's path is its prefill steps)."""
        for rid in preempted or ():
            self.pending.pop(rid, None)  # preempted: its next step waits for a resume, not for us
            self.preempted.add(rid)  # and the wait on its step in flight, still to come, is no verdict
        if len(self.preempted) > RING:
            self.preempted.clear()
        self.paused = paused
        if paused:
            self.pending.clear()  # a pause holds every request back by design
        if not tokens:
            self.events.append(("schedule_empty", -1, t, 0))
            return None
        n = self.next_step
        self.next_step += 1
        ids = frozenset(req_ids)
        if self.pending:
            for rid, (had_room, phase) in self.pending.items():
                if rid in ids and had_room:
                    self._verdict(rid, "early", phase)
            self.pending = {}  # not in this batch: it did not simply continue (finished, aborted...)
        self.room[n] = bool(room)
        if prefills:
            self.prefills[n] = frozenset(prefills)
        if self.candidate is not None:
            self.counts["early" if self.candidate & ids else "single"] += 1
            self.candidate = None
        self.inflight[n] = ids
        # k steps in flight (issue 45): a PP engine keeps up to its batch queue's size, not two
        self.max_in_flight = max(self.max_in_flight, len(self.inflight))
        self.counts["scheduled"] += 1
        self.events.append(("schedule", n, t, int(tokens)))
        return n

    def wait_start(self, n: int | None) -> None:
        if n is None:
            return
        ids = self.inflight.pop(n, None)
        self.room.pop(n, None)
        prefills = self.prefills.pop(n, frozenset())
        if ids is None:
            return  # its result was already waited for (a second result() returns at once)
        t = time.monotonic_ns()
        self.counts["waits"] += 1
        self.events.append(("wait", n, t, 0))
        self._wait_t[n] = t
        if self.candidate is not None:  # the previous wait had no batch after it: one batch only
            self.counts["single"] += 1
            self.candidate = None
        later = [m for m in self.inflight if m > n]
        if later:
            self.counts["overlapped"] += 1
        else:
            self.candidate = ids
        ahead = frozenset().union(*(self.inflight[m] for m in later)) if later else frozenset()
        all_room = all(self.room.get(m, True) for m in later) and not self.paused
        for rid in ids:
            if rid in self.preempted:
                self.preempted.discard(rid)
            elif rid in ahead:
                self._verdict(rid, "overlapped", "prefill" if rid in prefills else "decode")
            else:
                self.pending[rid] = (all_room, "prefill" if rid in prefills else "decode")

    def wait_end(self, n: int | None) -> None:
        t0 = self._wait_t.pop(n, None) if n is not None else None
        if t0 is not None:
            t = time.monotonic_ns()
            self.counts["wait_ns"] += t - t0
            self.events.append(("waited", n, t, t - t0))

    def facts(self, last: int = 24) -> dict:
        return {**self.counts, "max_in_flight": self.max_in_flight,
                "last_events": [list(e) for e in list(self.events)[-last:]]}


def delta(after: dict | None, before: dict | None) -> dict:
    """The counts of one run: `after` less `before` (both HostOrder.facts(), None: nothing)."""
    after = after or {}
    before = before or {}
    d = {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in COUNTS}
    if any(v < 0 for v in d.values()):  # a restarted engine core: its counts began at zero
        d = {k: int(after.get(k, 0)) for k in COUNTS}
    return d


def judge(counts: dict, tokens: int | None) -> tuple[bool | None, str]:
    """(effective, why) from one run's counts: True, False (LOST) or None (not judged)."""
    ov, early, single = counts.get("overlapped", 0), counts.get("early", 0), counts.get("single", 0)
    judged = ov + early
    if tokens is not None and tokens <= 0:
        return None, "no token was delivered"
    if judged < MIN_JUDGED:
        return None, (f"only {judged} wait(s) had a second batch available, fewer than {MIN_JUDGED} "
                      f"({single} with one batch only)")
    figs = (f"{ov} of {judged} waits on step N came after step N+1 was scheduled, {early} before it; "
            f"{single} with one batch only not counted")
    if early > EARLY_FRACTION * judged:
        return False, (f"the host waited on step N before scheduling step N+1 in {early} of {judged} steps "
                       f"(more than {EARLY_FRACTION:.0%}); {ov} overlapped, {single} with one batch only "
                       "not counted")
    return True, figs


def judge_process(proc: dict, before=None) -> tuple[bool | None, str]:
    """judge() over one run of one engine process: `proc` its facts now (with "host_order" and
    "tokens_out"), `before` every process's facts as the run began (None: since it started); its
    own earlier facts are found by pid (another pid: a restarted process, counted from zero)."""
    b = next((f for f in before or () if f.get("role") == proc.get("role") and f.get("pid") == proc.get("pid")), {})
    counts = delta(proc.get("host_order"), b.get("host_order"))
    tokens = int(proc.get("tokens_out", 0)) - int(b.get("tokens_out", 0))
    if tokens < 0:
        tokens = int(proc.get("tokens_out", 0))
    return judge(counts, tokens)


def line(effective: bool | None, why: str, evidence: str) -> str:
    """The overlap line every served target prints."""
    verdict = {True: "effective", False: "LOST", None: "not judged"}[effective]
    return f"overlap: {verdict} ({why}; {evidence})"


def schedules_during_forwards(events, forwards) -> tuple[int, int]:
    """(k, m): of the m schedules of a non-empty batch in `events` (HostOrder's) that fall within
    the span of `forwards` (the worker's [start, end] ns of each forward), k began while a forward
    ran. The time-side evidence where the worker is another process: an overlapped loop schedules
    step N+1 during step N's forward; one that waits first schedules while the worker idles."""
    fw = sorted((int(a), int(b)) for a, b in forwards or ())
    if not fw:
        return 0, 0
    lo, hi = fw[0][0], fw[-1][1]
    k = m = 0
    for kind, _, t, _ in events or ():
        if kind != "schedule" or not lo <= t <= hi:
            continue
        m += 1
        k += any(a <= t <= b for a, b in fw)
    return k, m


def judge_worker(now: dict | None, before: dict | None) -> tuple[bool | None, str]:
    """The worker's own overlap over one run, from its "forward_copy" counts (now, and as the run
    began; harness.agents.vllm.timing.model_forward): of the forwards whose step arrived while the
    previous step's sampled ids were still being copied to the host, how many started only once
    the copy had landed. Same rule as the engine core's waits."""
    now, before = now or {}, before or {}
    d = {k: int(now.get(k, 0)) - int(before.get(k, 0)) for k in ("judged", "after_copy")}
    if d["judged"] < 0 or d["after_copy"] < 0:  # a restarted worker: its counts began at zero
        d = {k: int(now.get(k, 0)) for k in ("judged", "after_copy")}
    judged, late = d["judged"], d["after_copy"]
    if judged < MIN_JUDGED:
        return None, (f"worker: {judged} forward(s) began with the previous step's copy in flight, fewer than "
                      f"{MIN_JUDGED}: not judged")
    figs = (f"{late} of {judged} forwards whose step arrived with the previous step's copy in flight waited for that "
            "copy before the forward")
    if late > EARLY_FRACTION * judged:
        return False, (f"the worker began step N+1's forward only after step N's sampled ids reached the host: "
                       f"{figs} (more than {EARLY_FRACTION:.0%})")
    return True, f"worker: {figs}"
