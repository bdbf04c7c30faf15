"""Steps are a result too: the agent's books of how each request was scheduled, from inside
vLLM's scheduler (the engine core process).

Some async-scheduling bugs change no token: a request scheduled one step past its max_tokens and
its sample thrown away, or a request left in the running set unscheduled while the step had
token budget to spare. So, per request (vLLM's request id), after every schedule():
- `scheduled`: the steps it was scheduled in;
- `sampled`: those whose tokens reach its last known token (the step samples for it);
- `waited`: the steps it sat in the running set unscheduled while the step scheduled something
  and had token budget free, counted only once it was scheduled again (a request whose last
  token is in flight sits out the step after it, as the async guard at max_tokens wants, and
  then finishes: that is not a wait);
- `preempted` and how it finished (`finish`: vLLM's status name), so the oracle
  (harness.oracles.steps) compares like with like.
Each request is keyed for the client by its prompt ids and max_tokens (request_key), which is
what the suites know of it. The books live in their own facts file (role "steps"), the last
KEEP requests.
"""
from __future__ import annotations

import zlib
from collections import OrderedDict

KEEP = 2048  # requests kept in the books (a gate sends a few hundred to one server)
ROLE = "steps"
FIELDS = ("key", "scheduled", "sampled", "waited", "pending", "preempted", "finish")


def request_key(prompt_ids, max_tokens) -> str:
    """What the client and the engine both know of a request: its prompt ids and max_tokens."""
    ids = ",".join(str(int(x)) for x in prompt_ids)
    return f"{zlib.crc32(ids.encode()):08x}:{max_tokens}"


class Books:
    def __init__(self, facts):
        self.facts = facts  # fn(role) -> planmod.Facts
        self.reqs: OrderedDict = OrderedDict()  # vLLM request id -> list in FIELDS order

    def _rec(self, r):
        rec = self.reqs.get(r.request_id)
        if rec is None:
            max_tokens = getattr(r, "max_tokens", None)
            if max_tokens is None:
                max_tokens = getattr(getattr(r, "sampling_params", None), "max_tokens", None)
            rec = self.reqs[r.request_id] = [request_key(r.prompt_token_ids or (), max_tokens), 0, 0, 0, 0, 0, ""]
            while len(self.reqs) > KEEP:
                self.reqs.popitem(last=False)
        return rec

    def after_schedule(self, sched, out) -> None:
        total = int(getattr(out, "total_num_scheduled_tokens", 0) or 0)
        if total <= 0:
            return  # paused, or nothing to run: no step
        budget = getattr(sched, "max_num_scheduled_tokens", None) or sched.scheduler_config.max_num_batched_tokens
        scheduled = out.num_scheduled_tokens  # request id -> tokens this step
        for rid in scheduled:
            r = sched.requests.get(rid)
            if r is None:
                continue
            rec = self._rec(r)
            rec[1] += 1
            if r.num_computed_tokens >= r.num_tokens:  # (advanced by the schedule) every known token
                rec[2] += 1
            rec[3] += rec[4]  # it ran again: the steps it sat out were a wait
            rec[4] = 0
        if total < budget:
            for r in sched.running:
                if r.request_id not in scheduled:
                    self._rec(r)[4] += 1
        self.publish()

    def preempted(self, request) -> None:
        self._rec(request)[5] += 1
        self._rec(request)[4] = 0  # out of the running set: a wait there is no longer owed
        self.publish()

    def finished(self, request) -> None:
        if request is None:
            return
        status = getattr(request, "status", None)
        rec = self._rec(request)
        rec[6] = getattr(status, "name", str(status))
        rec[4] = 0  # it sat out the step after its last token: that was no wait
        self.publish()  # the last request of a burst finishes after the last schedule

    def publish(self) -> None:
        # a copy: the facts flusher serializes it on another thread while this one schedules
        self.facts(ROLE).set(requests={k: list(v) for k, v in self.reqs.items()})


_BOOKS: Books | None = None


def _schedule(orig):
    def schedule(self, *a, **kw):
        out = orig(self, *a, **kw)
        try:
            _BOOKS.after_schedule(self, out)
        except Exception as e:  # the books must never break the engine
            _BOOKS.facts(ROLE).set(counter_error=f"steps: {e}")
        return out
    return schedule


def _preempt(orig):
    def _preempt_request(self, request, *a, **kw):
        out = orig(self, request, *a, **kw)
        _BOOKS.preempted(request)
        return out
    return _preempt_request


def _check_stop(orig):
    def check_stop(request, *a, **kw):
        out = orig(request, *a, **kw)
        if out:
            _BOOKS.finished(request)
        return out
    return check_stop


def _finish(orig):
    def finish_requests(self, request_ids, *a, **kw):
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids or ())
        reqs = [self.requests.get(i) for i in ids]
        out = orig(self, request_ids, *a, **kw)
        for r in reqs:
            if r is not None and r.request_id in _BOOKS.reqs:
                _BOOKS.finished(r)
        return out
    return finish_requests


# the agent's patch points (harness.agents.vllm.points) these books wrap
PATCHES = {"schedule": _schedule, "preempt": _preempt, "check_stop": _check_stop, "finish": _finish}


def install(patch, facts) -> None:
    """patch(point, make) as the agent's (install.patch); facts(role) -> planmod.Facts."""
    global _BOOKS
    _BOOKS = Books(facts)
    missing = []
    for point, make in PATCHES.items():
        try:
            patch(point, make)
        except Exception as e:  # a release without the point: no books, and the steps row says
            missing.append(f"{point}: {e}")  # "not exercised" (never a pass); the engine runs on
    if missing:
        facts(ROLE).set(books_missing=missing)
