"""When things happen in the engine core and the worker: the engine loop's first facts, each
engine step (overlapped schedules, tokens delivered: what the target's hang watchdog polls), the
host's order of schedule and wait events (harness.agents.host_order: what the overlap oracle
judges), and the worker's forwards (their times, and the forward time that delays given in steps
are scaled by). Async scheduling is kept on here where vLLM's CPU platform turns it off.

The delays and faults of the engine step and the worker's step are taken at these wrappers
(harness.agents.vllm.faults lists where each one acts).
"""
from __future__ import annotations

import threading
import time
from collections import deque

from harness.agents import progress
from harness.agents.host_order import HostOrder
from harness.agents.vllm import cuda_stubs, faults, ranks, state, steps


# -- async scheduling on CPU ---------------------------------------------------------------
def platform_config(orig):
    fn = orig.__func__ if isinstance(orig, classmethod) else orig

    def check_and_update_config(cls, vllm_config):
        wanted = vllm_config.scheduler_config.async_scheduling
        fn(cls, vllm_config)
        if wanted and state.PLAN.overlap:  # plan "overlap": false leaves vLLM's own decision standing
            vllm_config.scheduler_config.async_scheduling = True
        state.facts("api").set(async_requested=wanted,
                               async_effective=vllm_config.scheduler_config.async_scheduling)
        state.facts("api").write(True)
    return classmethod(check_and_update_config)


def engine_loop(orig):
    def run_busy_loop(self, *a, **kw):
        f = state.facts("engine")
        f.set(async_scheduling=bool(self.vllm_config.scheduler_config.async_scheduling),
              scheduler=type(self.scheduler).__name__,
              batch_queue_size=int(getattr(self, "batch_queue_size", 1) or 1),
              overlapped_schedules=0, steps=0, tokens_out=0,
              executor=type(getattr(self, "model_executor", None)).__name__)
        state.register_stack_dump()
        _time_host(self)
        f.write(True)
        return orig(self, *a, **kw)
    return run_busy_loop


# -- the host's order of events (harness.agents.host_order) and progress --------------------
_HOST: HostOrder | None = None
ENGINE_THREAD = {"id": None}
_TOKENS = progress.TokenClock()  # tokens delivered, the gaps between steps that delivered some


class _TimedFuture:
    """A batch's result future that notes when the host starts and stops waiting on it."""

    def __init__(self, fut, step):
        self._fut, self._step = fut, step

    def result(self, *a, **kw):
        _HOST.wait_start(self._step)
        try:
            return self._fut.result(*a, **kw)
        finally:
            _HOST.wait_end(self._step)

    def __getattr__(self, name):
        return getattr(self._fut, name)


class _TimedQueue(deque):
    """The engine core's batch queue, unchanged in shape: each batch put in it gets a future
    that times the host's wait on it."""

    def appendleft(self, item):
        fut, sched_out, *rest = item
        step = _STEP_OF.pop(id(sched_out), None)
        super().appendleft((_TimedFuture(fut, step) if step is not None else fut, sched_out, *rest))


_STEP_OF: dict[int, int] = {}  # id(scheduler output) -> step number, between schedule and queue


def _time_host(core) -> None:
    """Record when the engine core starts scheduling each batch and when it waits on each."""
    global _HOST
    ENGINE_THREAD["id"] = threading.get_ident()
    if core.batch_queue is None:
        return  # the synchronous loop: nothing overlaps, nothing to order
    _HOST = HostOrder()
    core.batch_queue = _TimedQueue(core.batch_queue, maxlen=core.batch_queue.maxlen)
    schedule = core.scheduler.schedule

    sched = core.scheduler
    _HOST.on_request = steps.overlap_verdict  # each request's share of overlapped waits, in its books

    def timed_schedule(*a, **kw):
        t = time.monotonic_ns()
        out = schedule(*a, **kw)
        step = _HOST.scheduled(out.num_scheduled_tokens.keys(), out.total_num_scheduled_tokens, t,
                               room=_has_room(sched, out), preempted=getattr(out, "preempted_req_ids", None) or (),
                               paused=_paused(sched),
                               prefills=[r for r, k in out.num_scheduled_tokens.items() if k > 1])
        if step is not None:
            _STEP_OF[id(out)] = step
        return out
    core.scheduler.schedule = timed_schedule


def _has_room(sched, out) -> bool:
    """The batch left token budget and a slot unused: a request it did not continue was held
    back, not crowded out (harness.agents.host_order, per request)."""
    budget = getattr(sched, "max_num_scheduled_tokens", None) or sched.scheduler_config.max_num_batched_tokens
    slots = getattr(sched, "max_num_running_reqs", None) or sched.scheduler_config.max_num_seqs
    return out.total_num_scheduled_tokens < budget and len(out.num_scheduled_tokens) < slots


def _paused(sched) -> bool:
    pause = getattr(sched, "_pause_state", None)
    return pause is not None and getattr(pause, "name", "UNPAUSED") != "UNPAUSED"


def _delivered(core, outputs) -> None:
    """Count the tokens a step handed to the API server, and the gap between such steps (what
    the target's hang watchdog derives its bound from)."""
    n = 0
    for eco in (outputs or {}).values():
        for o in getattr(eco, "outputs", None) or ():
            n += len(getattr(o, "new_token_ids", None) or ())
    f = state.facts("engine")
    idle = not core.scheduler.has_requests()
    _TOKENS.delivered(f, n, idle)
    if _HOST is not None:
        f.set(host_order=_HOST.facts(last=96))
    f.write(idle)  # at the end of a burst at once: a run's last figures are there when it returns


def engine_step(orig):
    def step_with_batch_queue(self):
        state.PLAN.delay("engine_step")
        q = self.batch_queue
        if state.PLAN.fault("spin_no_progress"):
            return faults.spin()
        if q and state.PLAN.fault("wait_before_schedule"):
            q[-1][0].result()  # the oldest batch in flight, before the next one is scheduled
        before = len(q) if q is not None else 0
        out = orig(self)
        f = state.facts("engine")
        f.add("steps")
        # a call that schedules leaves the queue at least as long as it found it (it pops at most
        # one batch); one that does not schedule pops one. Scheduling with a batch already in
        # the queue is a schedule of step N+1 while step N is in flight.
        if q is not None and before >= 1 and len(q) >= before:
            f.add("overlapped_schedules")
        _delivered(self, out[0] if isinstance(out, tuple) else None)
        return out
    return step_with_batch_queue


def engine_step_sync(orig):
    def step(self, *a, **kw):
        if state.PLAN.fault("spin_no_progress"):
            return faults.spin()
        out = orig(self, *a, **kw)
        state.facts("engine").add("steps")
        _delivered(self, out[0] if isinstance(out, tuple) else None)
        return out
    return step


def runner_init(orig):
    def __init__(self, *a, **kw):
        # 0.10.2-0.11.0: the input event recorded on torch.cuda's default stream
        with cuda_stubs.cuda_stubs(cuda_stubs.STUB_CUDA["runner"], (), cuda_stubs.CudaStubs.RUNNER):
            orig(self, *a, **kw)
        state.facts("worker").set(use_async_scheduling=bool(getattr(self, "use_async_scheduling", False)),
                                  async_outputs=0, **ranks.rank_facts())
        state.register_stack_dump()
        state.facts("worker").write(True)
    return __init__


def worker_execute(orig):
    def execute_model(self, *a, **kw):
        state.PLAN.delay("worker_execute")
        if "forward_inline" not in state.facts("worker").data and ENGINE_THREAD["id"] is not None:
            # on the engine core's own thread (UniProcExecutor): nothing runs the step meanwhile
            state.facts("worker").set(forward_inline=threading.get_ident() == ENGINE_THREAD["id"])
            state.facts("worker").write(True)
        t = time.monotonic()
        t_ns = time.monotonic_ns()
        watch_copy()  # the step arrives: is the previous step's copy still in flight?
        try:
            return orig(self, *a, **kw)
        finally:
            _measured(time.monotonic() - t)
            # when the worker ran each forward, on the clock the engine core's events use: what
            # the target compares the engine core's schedules with (did one run during a forward?)
            _FORWARDS.append((t_ns, time.monotonic_ns()))
            state.facts("worker").set(forwards=[list(x) for x in _FORWARDS])
            state.facts("worker").write()
    return execute_model


def model_forward(orig):
    """The worker's own overlap (issue 36, item 4): a forward of step N+1 that starts only after
    step N's sampled ids reached the host because the step waited for them. Judged: the forwards
    whose step arrived with the previous step's copy still in flight; of those, the ones whose
    thread blocked on a sampled-id copy between the step's arrival and the forward (the copy
    engine's event says so: harness.agents.vllm.copy_engine). Not "the copy had landed by the
    forward": on CPU the copy thread often lands it while the step's inputs are built, by the
    GIL's turns, with nobody waiting. Counted in the worker's facts ("forward_copy") and judged
    by the target with the run's overlap (host_order.judge_worker)."""
    def _model_forward(self, *a, **kw):
        forward_begins()
        return orig(self, *a, **kw)
    return _model_forward


def watch_copy() -> None:
    """From here to the next forward, a wait of this thread on the newest sampled-id copy is a lost
    overlap, if that copy is still in flight now (judged at forward_begins). V1 calls it as a worker
    step arrives (execute_model); V2 as the copy starts (harness.agents.vllm.v2.agent._hook_forward
    says why)."""
    last = LAST_COPY[0]
    _FWD["pending"] = last if last is not None and not last.query() else None
    _FWD["thread"], _FWD["blocked"] = threading.get_ident(), False


def forward_begins() -> None:
    """The step's model forward begins: counted when the copy was in flight at watch_copy, and as
    late when this thread blocked on a sampled-id copy since (copy_wait_blocks). A
    stage that samples nothing (PP, all but the last) has no copy: nothing counted there."""
    pending = _FWD.pop("pending", None)
    blocked = _FWD.pop("blocked", False)
    _FWD.pop("thread", None)
    if pending is not None:
        c = _FWD_COUNTS
        c["judged"] += 1
        if blocked:
            c["after_copy"] += 1
        state.facts("worker").set(forward_copy=dict(c))


def copy_wait_blocks() -> None:
    """A sampled-id copy's event is about to block its caller: noted when the caller is a worker
    step that has not reached its forward yet (copy_engine._CopyDone.synchronize)."""
    if _FWD.get("thread") == threading.get_ident():
        _FWD["blocked"] = True


LAST_COPY: list = [None]  # the newest sampled-id copy's event (harness.agents.vllm.copy_engine)
_FWD: dict = {}
_FWD_COUNTS = {"judged": 0, "after_copy": 0}
_FORWARDS: deque = deque(maxlen=64)
# the worker's forward time (s), for delays given in steps. The forward, not the step period:
# a held-back reader stretches the period, and a delay that followed it would feed on itself.
_STEP = {"ema": 0.0}


def step_period() -> float:
    return _STEP["ema"]


def _measured(dt: float) -> None:
    dt = min(dt, 1.0)
    _STEP["ema"] = dt if not _STEP["ema"] else 0.8 * _STEP["ema"] + 0.2 * dt
