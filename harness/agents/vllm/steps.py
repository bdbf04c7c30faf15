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
  (harness.oracles.steps) compares like with like;
- `evidence`: the mechanisms of known upstream bugs, counted for this request (issue 36: a known
  entry claims a finding only with its own mechanism counted for that request, never by the
  finding's wording): `stale_dropped:<path>`, a preemption that drops the request's in-flight
  sample (it is drawn again at the same position, and vLLM rewinds no generator for it), by the
  path that preempted it (`reset`: reset_prefix_cache with running requests; `kv_pressure`: the
  scheduler making room), and `stale_dropped_prompt:<path>` when that step was its last prompt
  chunk's (no token of its own delivered yet); `scheduled_at_cap`, a step scheduled while the request's last token
  (max_tokens) was already in flight; `grammar_in_flight`, a structured-output request scheduled
  with a token in flight; and the path features of issue 44's pairs: `prefix_hit` and
  `prefill_chunk` (its first step), `preempted_in_flight` (a preemption with a step of it in flight);
- `after_abort`: the steps it was scheduled in after its abort reached the scheduler
  (finish_requests with an aborted status): an aborted request gets no more work, both arms;
- `admit_waits`: the schedules it sat in the waiting queue (status WAITING, never preempted) while
  the step left slots, token budget and KV blocks for its prompt free, no preemption and no pause
  in the step: admission is a result too (the oracle compares the arms). A slot is free by what can
  run (issue 44): one held by a running request the scheduler will not schedule again (it only
  waits for its in-flight last token: `done_waiting`) is free, and a schedule that ran nothing
  counts too (every slot held that way).
- `overlapped`, `early`: the host's waits on a step of the request that a batch scheduled
  before the wait had already continued, and those that came first although the request could
  have been continued ahead (harness.agents.host_order, per request; async on only), and the same
  for its prefill steps alone (`overlapped_prefill`, `early_prefill`): the harness sums them by
  path, so a path on which overlap stops shows while the rest of the run overlaps.
Each request is keyed for the client by its prompt ids and max_tokens (request_key), which is
what the suites know of it. The books live in their own facts file (role "steps"), the last
KEEP requests.
"""
from __future__ import annotations

import zlib
from collections import OrderedDict

KEEP = 2048  # requests kept in the books (a gate sends a few hundred to one server)
ROLE = "steps"
FIELDS = ("key", "scheduled", "sampled", "waited", "pending", "preempted", "finish", "evidence", "after_abort",
          "admit_waits", "overlapped", "early", "overlapped_prefill", "early_prefill")
# vLLM's function that called _preempt_request -> the path it stands for
PREEMPT_PATHS = {"reset_prefix_cache": "reset", "schedule": "kv_pressure"}


def request_key(prompt_ids, max_tokens) -> str:
    """What the client and the engine both know of a request: its prompt ids and max_tokens."""
    ids = ",".join(str(int(x)) for x in prompt_ids)
    return f"{zlib.crc32(ids.encode()):08x}:{max_tokens}"


class Books:
    def __init__(self, facts):
        self.facts = facts  # fn(role) -> planmod.Facts
        self.reqs: OrderedDict = OrderedDict()  # vLLM request id -> list in FIELDS order
        self.aborted: OrderedDict = OrderedDict()  # request ids whose abort reached the scheduler

    def _rec(self, r):
        rec = self.reqs.get(r.request_id)
        if rec is None:
            max_tokens = getattr(r, "max_tokens", None)
            if max_tokens is None:
                max_tokens = getattr(getattr(r, "sampling_params", None), "max_tokens", None)
            rec = self.reqs[r.request_id] = [request_key(r.prompt_token_ids or (), max_tokens), 0, 0, 0, 0, 0, "",
                                             {}, 0, 0, 0, 0, 0, 0]
            while len(self.reqs) > KEEP:
                self.reqs.popitem(last=False)
        return rec

    def after_schedule(self, sched, out) -> None:
        total = int(getattr(out, "total_num_scheduled_tokens", 0) or 0)
        budget = getattr(sched, "max_num_scheduled_tokens", None) or sched.scheduler_config.max_num_batched_tokens
        if total <= 0:
            # nothing ran: no step to book, but a schedule that left a newcomer waiting while
            # every slot was held by requests it will not schedule again is admission lost (issue 44)
            if getattr(sched, "waiting", None):
                self._admission(sched, out, budget)
                self.publish()
            return
        scheduled = out.num_scheduled_tokens  # request id -> tokens this step
        for rid in scheduled:
            r = sched.requests.get(rid)
            if r is None:
                continue
            rec = self._rec(r)
            rec[1] += 1
            if rec[1] == 1 and not getattr(r, "num_preemptions", 0):  # its first step: what its path took
                _first_step(rec, r, int(scheduled[rid]))
            if rid in self.aborted:  # work for a request whose client is gone
                rec[8] += 1
            samples = r.num_computed_tokens >= r.num_tokens  # (advanced by the schedule) every known token
            cap = getattr(r, "max_tokens", None)
            # the tokens in flight before this step (the schedule already added this step's placeholder)
            ahead = int(getattr(r, "num_output_placeholders", 0) or 0) - (1 if samples else 0)
            if cap is not None and ahead > 0 and r.num_output_tokens + ahead >= cap:
                # scheduled with its last token already in flight (async-step-past-max-tokens' mechanism)
                _count(rec, "scheduled_at_cap")
            if ahead > 0 and getattr(r, "use_structured_output", False):
                # its grammar's mask for this step is built before the token in flight is accepted
                # where the scheduler builds it inside schedule() (vLLM before vllm#26866: vllm#26866's mechanism)
                _count(rec, "grammar_in_flight")
            if samples:
                rec[2] += 1
            rec[3] += rec[4]  # it ran again: the steps it sat out were a wait
            rec[4] = 0
        # with a drafter vLLM also takes draft slots from its input budget for each request it
        # schedules, and stops once no more than those are left (Scheduler.schedule, draft_slots)
        slots = draft_slots(sched)
        room = budget - total - slots * len(scheduled)
        if room > slots:
            for r in sched.running:
                if r.request_id not in scheduled and could_continue(sched, r):
                    self._rec(r)[4] += 1
            self._admission(sched, out, room, slots)
        self.publish()

    def _admission(self, sched, out, budget: int, draft: int = 0) -> None:
        """Requests left waiting although the step had room for them: a slot, token budget (`budget`
        tokens were left; each request admitted also takes `draft` slots for its drafter,
        draft_slots) and KV blocks for the whole prompt; a step that preempted or a paused engine
        admits no one by design."""
        if getattr(out, "preempted_req_ids", None):
            return
        pause = getattr(sched, "_pause_state", None)
        if pause is not None and getattr(pause, "name", "UNPAUSED") != "UNPAUSED":
            return
        slots = getattr(sched, "max_num_active_reqs", None) or getattr(sched, "max_num_running_reqs", 0)
        # a slot is free by what can run (issue 44): a running request the scheduler will not
        # schedule again (it only waits for its in-flight last token) holds none
        held = len(sched.running) - len(done_waiting(sched, getattr(out, "num_scheduled_tokens", None) or {}))
        if not slots or held >= slots:
            return
        try:
            free = sched.kv_cache_manager.block_pool.get_num_free_blocks()
            size = int(getattr(sched, "block_size", 0) or sched.cache_config.block_size)
        except AttributeError:
            return  # a release whose books we cannot read: no count (the oracle sees none)
        # vLLM admits from the head of its queue (the policy's order) and stops at the first request
        # whose blocks do not fit: a newcomer behind a preempted request that cannot resume yet is
        # held back by design (measured: a stress case on stock 0.32.0 under KV pressure counted 30
        # and 42 such "waits" before this walk). So walk the queue as vLLM does, giving each
        # request ahead its blocks and slot, and count only newcomers the walk reaches with room.
        free_slots = slots - held
        for r in list(sched.waiting):
            if free_slots <= 0 or budget <= draft:
                return
            status = getattr(getattr(r, "status", None), "name", "")
            if status not in ("WAITING", "PREEMPTED"):
                continue  # blocked on a grammar, a stream, a KV load: vLLM skips it and goes on
            if int(getattr(r, "num_stale_output_tokens", 0) or 0) and not getattr(r, "drop_stale_output", False):
                continue  # its stale output drains first: skipped, as vLLM does
            need = -(-(r.num_tokens + 1) // size)
            if free < need:
                return  # the head does not fit: nobody behind it is admitted this step
            free, free_slots, budget = free - need, free_slots - 1, budget - r.num_tokens - draft
            if status == "WAITING" and not getattr(r, "num_preemptions", 0):
                self._rec(r)[9] += 1  # a newcomer with room (a resumed one is the preemption's to judge)

    def preempted(self, request, path: str = "", ahead: int = 0) -> None:
        """`ahead`: the request's outputs in flight when vLLM began to preempt it (its placeholders)."""
        rec = self._rec(request)
        rec[5] += 1
        rec[4] = 0  # out of the running set: a wait there is no longer owed
        stale = int(getattr(request, "num_stale_output_tokens", 0) or 0)
        dropped = bool(getattr(request, "drop_stale_output", False)) and stale > 0
        if not hasattr(request, "drop_stale_output"):
            # before 0.27.0 vLLM keeps no stale-output books: its steps in flight are the placeholders
            # it had, and only the reset path throws their output away (reset_prefix_cache marks it
            # to discard its next output right after this preemption; KV pressure keeps it). Found by
            # the sweep's stress on 0.16.0: a seeded request reset with a step in flight, uncounted.
            stale, dropped = ahead, ahead > 0 and path == "reset"
        if stale:
            _count(rec, "preempted_in_flight")  # a step of it in flight (issue 44: a path feature, per request)
        if dropped:
            # its in-flight sample will be thrown away and its position sampled again
            _count(rec, f"stale_dropped:{path or 'unknown'}")
            if not int(getattr(request, "num_output_tokens", 0) or 0):
                # no token of its own delivered yet: the step dropped is its last prompt chunk's,
                # the one whose output carries its prompt logprobs (a later step's drop loses none)
                _count(rec, f"stale_dropped_prompt:{path or 'unknown'}")
        self.publish()

    def finished(self, request) -> None:
        if request is None:
            return
        status = getattr(request, "status", None)
        rec = self._rec(request)
        rec[6] = getattr(status, "name", str(status))
        rec[4] = 0  # it sat out the step after its last token: that was no wait
        self.publish()  # the last request of a burst finishes after the last schedule

    def overlap(self, rid, kind: str, phase: str = "decode") -> None:
        """One of the host's waits on a step of request `rid`, as HostOrder judged it for it (and
        apart, those on its prefill steps)."""
        rec = self.reqs.get(rid)
        if rec is not None:  # published with the next schedule
            rec[10 if kind == "overlapped" else 11] += 1
            if phase == "prefill":
                rec[12 if kind == "overlapped" else 13] += 1

    def publish(self) -> None:
        # a copy: the facts flusher serializes it on another thread while this one schedules
        # each record by its field names (harness.oracles.steps.StepRecord reads them)
        self.facts(ROLE).set(requests={k: {**dict(zip(FIELDS, v)), "evidence": dict(v[7])} for k, v in self.reqs.items()})


def could_continue(sched, r) -> bool:
    """A running request this step could have continued (issue 45: k steps in flight). Not one the
    pipeline holds back by design: under V2 + PP + async a decode is eligible again only pipeline
    size steps after its last (the decode stagger, vllm#32359 / #42187: `next_decode_eligible_step`),
    and the synchronous scheduler under PP (a batch queue of pipeline size) has nothing to compute
    for a request whose token is still in flight. With one worker neither holds, and every running
    request left out of a step with budget free is a wait, as before."""
    if getattr(sched, "current_step", 0) < getattr(r, "next_decode_eligible_step", 0):
        return False
    try:
        return r.num_tokens_with_spec + r.num_output_placeholders - r.num_computed_tokens > 0
    except AttributeError:  # a release whose request lacks these counts: judged as before
        return True


def done_waiting(sched, scheduled) -> list:
    """The running requests this step left out that the scheduler will not schedule again: their
    in-flight tokens reach max_tokens (vLLM's own async guard at max_tokens, the same sum), so they
    only wait for those tokens to land and finish. Each still holds a place in `running`, which
    vLLM's admission counts (vllm-project/vllm#45257)."""
    out = []
    for r in getattr(sched, "running", ()):
        ph = int(getattr(r, "num_output_placeholders", 0) or 0)
        cap = getattr(r, "max_tokens", None)
        if r.request_id in scheduled or ph <= 0 or cap is None:
            continue
        if r.num_computed_tokens + 2 - ph >= int(getattr(r, "num_prompt_tokens", 0) or 0) + cap:
            out.append(r)
    return out


def overlap_verdict(rid, kind: str, phase: str = "decode") -> None:
    """HostOrder's per-request callback (harness.agents.vllm.timing)."""
    if _BOOKS is not None:
        _BOOKS.overlap(rid, kind, phase)


_TAKES_DRAFT_SLOTS: list = []  # [bool] once read: vLLM's schedule() takes draft slots from its budget


def draft_slots(sched) -> int:
    """The input-budget slots vLLM's scheduler takes per scheduled request for its drafter
    (SpeculativeConfig.max_num_new_slots_for_drafting; 0 without a drafter, and 0 where schedule()
    does not take them: the property is in 0.26.0, the scheduler uses it from 0.28.0)."""
    spec = getattr(getattr(sched, "vllm_config", None), "speculative_config", None)
    if spec is None:
        return 0
    if not _TAKES_DRAFT_SLOTS:  # the scheduler module's own source (its schedule() is wrapped by now)
        import inspect
        import sys
        try:
            src = inspect.getsource(sys.modules["vllm.v1.core.sched.scheduler"])
        except (KeyError, OSError, TypeError):
            src = ""
        _TAKES_DRAFT_SLOTS.append("max_num_new_slots_for_drafting" in src)
    return int(getattr(spec, "max_num_new_slots_for_drafting", 0) or 0) if _TAKES_DRAFT_SLOTS[0] else 0


def _first_step(rec, r, tokens: int) -> None:
    """The path features of a request's first step, counted per request (issue 44, item 2: what met
    is read from the engine, never from the plan): `prefix_hit`, its computed tokens start past
    blocks another request cached; `prefill_chunk`, the step ended before its prompt did (a
    chunked prefill)."""
    if r.num_computed_tokens - tokens > 0:
        _count(rec, "prefix_hit")
    if r.num_computed_tokens < r.num_tokens:
        _count(rec, "prefill_chunk")


def _count(rec, what: str) -> None:
    rec[7][what] = rec[7].get(what, 0) + 1


def _preempt_path() -> str:
    """Which of vLLM's paths is preempting: the nearest vLLM caller of _preempt_request (our
    own wrappers of it may sit between)."""
    import sys
    f = sys._getframe(2)
    for _ in range(8):
        if f is None:
            break
        name = f.f_code.co_name
        if name in PREEMPT_PATHS and f.f_globals.get("__name__", "").startswith("vllm."):
            return PREEMPT_PATHS[name]
        f = f.f_back
    return "other"


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
        path = _preempt_path()
        ahead = int(getattr(request, "num_output_placeholders", 0) or 0)  # before vLLM rolls it back
        out = orig(self, request, *a, **kw)
        _BOOKS.preempted(request, path, ahead)
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
        status = a[0] if a else kw.get("finished_status")
        if "ABORT" in getattr(status, "name", str(status)):  # the abort reached the scheduler: no more work
            for i in ids:
                _BOOKS.aborted[i] = True
            while len(_BOOKS.aborted) > KEEP:
                _BOOKS.aborted.popitem(last=False)
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
