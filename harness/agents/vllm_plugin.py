"""The vLLM agent: loaded by vLLM itself in every one of its processes (API server, engine
core, worker) through this project's `vllm.general_plugins` entry point.

Inert unless a plan is handed over (harness.agents.plan). With one it
- keeps async scheduling on when it was asked for: vLLM's CPU platform turns it off silently;
- makes the sampled-id copy on CPU what it is on a GPU: asynchronous (a copy thread), into a
  host buffer that is reused (two, each handed out again only after its reader is done), with
  an event the reader waits on. This is where a missing wait or a missing second buffer does
  harm, exactly as with a non_blocking copy into pinned memory;
- sleeps at named points of the async path by seeded plan (harness.agents.vllm_points);
- injects the vLLM fault catalogue;
- writes facts: the effective setting in each process, how many schedules ran while another
  batch was in the queue, the host's order of schedule and wait events (harness.agents.host_order:
  what the overlap oracle judges), and progress (tokens delivered, the median gap between steps
  that delivered some: what the target's hang watchdog polls);
- dumps every thread's stack into the facts folder on SIGUSR1 (faulthandler), for a HANG report.
"""
from __future__ import annotations

import importlib
import queue
import threading
import time
from collections import deque

from harness.agents import plan as planmod
from harness.agents import progress
from harness.agents import vllm_steps
from harness.agents.host_order import HostOrder
from harness.agents.vllm_points import POINTS_BY_NAME, WRITTEN_AGAINST

_PLAN: planmod.Plan | None = None
_FACTS: dict[str, planmod.Facts] = {}
_INSTALLED = False


class AgentError(RuntimeError):
    pass


def _facts(role: str) -> planmod.Facts:
    f = _FACTS.get(role)
    if f is None:
        f = _FACTS[role] = planmod.Facts(_PLAN.data.get("facts_dir") if _PLAN else None, role)
    return f


def _resolve(point: str):
    p = POINTS_BY_NAME[point]
    try:
        mod = importlib.import_module(p.module)
    except ImportError as e:
        raise AgentError(f"overlap-harness agent: {p.module} does not import ({e}); the agent was written "
                         f"against vLLM {WRITTEN_AGAINST}") from None
    owner = mod
    parts = p.qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
        if owner is None:
            break
    if owner is None or not hasattr(owner, parts[-1]):
        import vllm
        raise AgentError(f"overlap-harness agent: vLLM {getattr(vllm, '__version__', '?')} has no "
                         f"{p.module}.{p.qualname} (patch point {point!r}, written against vLLM "
                         f"{WRITTEN_AGAINST})")
    return owner, parts[-1]


def _patch(point: str, make):
    owner, attr = _resolve(point)
    orig = owner.__dict__.get(attr, getattr(owner, attr))
    setattr(owner, attr, make(orig))


# -- async scheduling on CPU ---------------------------------------------------------------
def _platform_config(orig):
    fn = orig.__func__ if isinstance(orig, classmethod) else orig

    def check_and_update_config(cls, vllm_config):
        wanted = vllm_config.scheduler_config.async_scheduling
        fn(cls, vllm_config)
        if wanted and _PLAN.overlap:  # plan "overlap": false leaves vLLM's own decision standing
            vllm_config.scheduler_config.async_scheduling = True
        _facts("api").set(async_requested=wanted,
                          async_effective=vllm_config.scheduler_config.async_scheduling)
        _facts("api").write(True)
    return classmethod(check_and_update_config)


def _engine_loop(orig):
    def run_busy_loop(self, *a, **kw):
        f = _facts("engine")
        f.set(async_scheduling=bool(self.vllm_config.scheduler_config.async_scheduling),
              scheduler=type(self.scheduler).__name__,
              batch_queue_size=int(getattr(self, "batch_queue_size", 1) or 1),
              overlapped_schedules=0, steps=0, tokens_out=0,
              executor=type(getattr(self, "model_executor", None)).__name__)
        _register_stack_dump()
        _time_host(self)
        f.write(True)
        return orig(self, *a, **kw)
    return run_busy_loop


# -- the host's order of events (harness.agents.host_order) and progress --------------------
_HOST: HostOrder | None = None
_ENGINE_THREAD = {"id": None}
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
    _ENGINE_THREAD["id"] = threading.get_ident()
    if core.batch_queue is None:
        return  # the synchronous loop: nothing overlaps, nothing to order
    _HOST = HostOrder()
    core.batch_queue = _TimedQueue(core.batch_queue, maxlen=core.batch_queue.maxlen)
    schedule = core.scheduler.schedule

    def timed_schedule(*a, **kw):
        t = time.monotonic_ns()
        out = schedule(*a, **kw)
        step = _HOST.scheduled(out.num_scheduled_tokens.keys(), out.total_num_scheduled_tokens, t)
        if step is not None:
            _STEP_OF[id(out)] = step
        return out
    core.scheduler.schedule = timed_schedule


def _delivered(core, outputs) -> None:
    """Count the tokens a step handed to the API server, and the gap between such steps (what
    the target's hang watchdog derives its bound from)."""
    n = 0
    for eco in (outputs or {}).values():
        for o in getattr(eco, "outputs", None) or ():
            n += len(getattr(o, "new_token_ids", None) or ())
    f = _facts("engine")
    idle = not core.scheduler.has_requests()
    _TOKENS.delivered(f, n, idle)
    if _HOST is not None:
        f.set(host_order=_HOST.facts(last=96))
    f.write(idle)  # at the end of a burst at once: a run's last figures are there when it returns


def _register_stack_dump() -> None:
    progress.register_stack_dump(_PLAN.data.get("facts_dir") if _PLAN else None)


def _engine_step(orig):
    def step_with_batch_queue(self):
        _PLAN.delay("engine_step")
        q = self.batch_queue
        if _PLAN.fault("spin_no_progress"):
            return _spin()
        if q and _PLAN.fault("wait_before_schedule"):
            q[-1][0].result()  # the oldest batch in flight, before the next one is scheduled
        before = len(q) if q is not None else 0
        out = orig(self)
        f = _facts("engine")
        f.add("steps")
        # a call that schedules leaves the queue at least as long as it found it (it pops at most
        # one batch); one that does not schedule pops one. Scheduling with a batch already in
        # the queue is a schedule of step N+1 while step N is in flight.
        if q is not None and before >= 1 and len(q) >= before:
            f.add("overlapped_schedules")
        _delivered(self, out[0] if isinstance(out, tuple) else None)
        return out
    return step_with_batch_queue


def _spin():
    """Fault spin_no_progress: the engine core steps and never delivers (a livelock such as
    outputs taken newest-first): vLLM's loop calls the step again after 1 ms, for ever."""
    f = _facts("engine")
    f.add("steps")
    f.write()
    return None, False


def _engine_step_sync(orig):
    def step(self, *a, **kw):
        if _PLAN.fault("spin_no_progress"):
            return _spin()
        out = orig(self, *a, **kw)
        _facts("engine").add("steps")
        _delivered(self, out[0] if isinstance(out, tuple) else None)
        return out
    return step


def _runner_init(orig):
    def __init__(self, *a, **kw):
        orig(self, *a, **kw)
        _facts("worker").set(use_async_scheduling=bool(getattr(self, "use_async_scheduling", False)),
                             async_outputs=0)
        _register_stack_dump()
        _facts("worker").write(True)
    return __init__


def _worker_execute(orig):
    def execute_model(self, *a, **kw):
        _PLAN.delay("worker_execute")
        if "forward_inline" not in _facts("worker").data and _ENGINE_THREAD["id"] is not None:
            # on the engine core's own thread (UniProcExecutor): nothing runs the step meanwhile
            _facts("worker").set(forward_inline=threading.get_ident() == _ENGINE_THREAD["id"])
            _facts("worker").write(True)
        t = time.monotonic()
        t_ns = time.monotonic_ns()
        try:
            return orig(self, *a, **kw)
        finally:
            _measured(time.monotonic() - t)
            # when the worker ran each forward, on the clock the engine core's events use: what
            # the target compares the engine core's schedules with (did one run during a forward?)
            _FORWARDS.append((t_ns, time.monotonic_ns()))
            _facts("worker").set(forwards=[list(x) for x in _FORWARDS])
            _facts("worker").write()
    return execute_model


_FORWARDS: deque = deque(maxlen=64)


# -- the sampled-id copy, asynchronous on CPU ---------------------------------------------
class _CopyDone:
    """Stands in for the copy-ready event: record() is implied by the copy thread."""

    def __init__(self):
        self._done = threading.Event()

    def record(self, *a, **kw):
        pass

    def synchronize(self):
        self._done.wait()

    def query(self) -> bool:
        return self._done.is_set()


class _NoWait:
    def synchronize(self):
        pass


class _HostBuffer:
    def __init__(self):
        self.tensor = None
        self.writer = 0  # sequence number of the last copy queued into it
        self.free = threading.Event()
        self.free.set()

    def view(self, like):
        import torch
        n = like.numel()
        if self.tensor is None or self.tensor.numel() < n or self.tensor.dtype != like.dtype:
            self.tensor = torch.zeros(max(n, 1024), dtype=like.dtype)  # pinned memory is reused, not fresh
        return self.tensor[:n].view(like.shape)


class CopyEngine:
    """One copy thread and two reused host buffers per worker process."""

    def __init__(self, buffers: int = 2):
        self.buffers = [_HostBuffer() for _ in range(buffers)]
        self.next = 0
        self.seq = 0
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, name="oh-copy", daemon=True).start()

    def _loop(self):
        import torch
        while True:
            src, dst, done = self.q.get()
            try:
                _PLAN.delay("output_copy", _step_period())
                with torch.inference_mode():  # the buffers are made inside vLLM's inference mode
                    dst.copy_(src)
            except Exception as e:  # never leave a reader waiting forever
                _facts("worker").set(error=f"overlap-harness agent: copy thread: {e}")
                _facts("worker").write(True)
            finally:
                done._done.set()

    def start(self, src):
        """Queue a copy of `src` into a host buffer; (the buffer view, the event, the buffer)."""
        if _PLAN.fault("pinned_buffer_reuse"):
            buf = self.buffers[0]  # one buffer, reused without waiting for its reader
        else:
            buf = self.buffers[self.next % len(self.buffers)]
            self.next += 1
            buf.free.wait()  # handed out again only after the previous reader is done
            buf.free.clear()
        dst = buf.view(src)
        done = _CopyDone()
        self.seq += 1
        done.seq = buf.writer = self.seq
        self.q.put((src, dst, done))
        return dst, done, buf


_COPY: CopyEngine | None = None
# the worker's forward time (s), for delays given in steps. The forward, not the step period:
# a held-back reader stretches the period, and a delay that followed it would feed on itself.
_STEP = {"ema": 0.0}


def _step_period() -> float:
    return _STEP["ema"]


def _measured(dt: float) -> None:
    dt = min(dt, 1.0)
    _STEP["ema"] = dt if not _STEP["ema"] else 0.8 * _STEP["ema"] + 0.2 * dt


def _output_copy(orig):
    def __init__(self, *a, **kw):
        global _COPY
        orig(self, *a, **kw)
        _facts("worker").add("async_outputs")
        src = self._sampled_token_ids
        if src.device.type != "cpu":
            return  # a real device: vLLM's own non_blocking copy and event are the real thing
        if _COPY is None:
            _COPY = CopyEngine()
        self.sampled_token_ids_cpu, self.async_copy_ready_event, self._oh_buffer = _COPY.start(src)
    return __init__


def _before_wait(orig):
    def get_output(self):
        _PLAN.delay("before_wait", _step_period())
        ev = self.async_copy_ready_event
        if _PLAN.fault("sampled_ids_no_wait"):
            self.async_copy_ready_event = _NoWait()
        try:
            return orig(self)
        finally:
            self.async_copy_ready_event = ev
            buf = getattr(self, "_oh_buffer", None)
            if buf is not None and buf.writer != ev.seq:
                _facts("worker").add("buffer_overwritten")  # a later copy was queued before we read
            if buf is not None:
                ev.synchronize()  # the copy itself has landed before the buffer is handed out again
                buf.free.set()
            _facts("worker").write()
    return get_output


def _penalty_ids(orig):
    def update_async_output_token_ids(self):
        if _PLAN.fault("penalty_stale_output_ids"):
            return
        return orig(self)
    return update_async_output_token_ids


# -- path counters: how often each attacked path ran (harness.targets.vllm_paths) ---------
# inside an engine step (a preemption there is the scheduler's, for KV space), and whether a
# batch was in flight then (async: the scheduler works on step N+1 while N runs)
_IN_FLIGHT = {"engine": False, "step": False}


def _counting(role: str, key, when=None):
    """A patch that calls the original and adds to `key` (a name, or fn(self, args, result) ->
    {name: n}) when `when(self, args, result)` holds."""
    def make(orig):
        fn = orig.__func__ if isinstance(orig, staticmethod) else orig

        def counted(*a, **kw):
            out = fn(*a, **kw)
            a = a + tuple(kw.values())  # keyword arguments in the signature's order, as callers pass them
            try:
                if when is None or when(a, out):
                    counts = key(a, out) if callable(key) else {key: 1}
                    f = _facts(role)
                    for k, n in counts.items():
                        if n:
                            f.add(k, n)
            except Exception as e:  # a counter must never break the engine
                _facts(role).set(counter_error=f"{key}: {e}")
            return out
        return staticmethod(counted) if isinstance(orig, staticmethod) else counted
    return make


def _engine_step_in_flight(orig):
    def step_with_batch_queue(self):
        q = self.batch_queue
        _IN_FLIGHT["engine"] = q is not None and len(q) >= 1
        _IN_FLIGHT["step"] = True
        try:
            return orig(self)
        finally:
            _IN_FLIGHT["engine"] = _IN_FLIGHT["step"] = False
    return step_with_batch_queue


def _engine_step_sync_flag(orig):
    def step(self, *a, **kw):
        _IN_FLIGHT["step"] = True
        try:
            return orig(self, *a, **kw)
        finally:
            _IN_FLIGHT["step"] = False
    return step


def _preempted(a, out):
    return {"preemptions": 1, "preemptions_kv": int(_IN_FLIGHT["step"]),
            "preemptions_in_flight": int(_IN_FLIGHT["engine"])}


def _scheduled(a, out):
    """Per schedule: requests given only part of their prompt (chunked prefill), and the sampling
    steps of requests with max_tokens 1 or 2 (a step samples once the request's known tokens
    are all computed)."""
    sched = a[0]
    counts = {"chunked_prefills": 0, "sampled_max1": 0, "sampled_max2": 0}
    for rid in out.num_scheduled_tokens:
        r = sched.requests.get(rid)
        if r is None:
            continue
        if r.num_computed_tokens < r.num_prompt_tokens:
            counts["chunked_prefills"] += 1
        elif r.max_tokens in (1, 2) and r.num_computed_tokens >= r.num_tokens:
            counts[f"sampled_max{r.max_tokens}"] += 1
    return counts


def _added(a, out):
    r = a[1]
    sp = r.sampling_params
    return {"seeded_requests": int(sp.seed is not None), "logprob_requests": int(bool(sp.logprobs)),
            f"max{sp.max_tokens}_requests": int(sp.max_tokens in (1, 2)),
            "stop_token_id_requests": int(bool(sp.stop_token_ids))}


def _aborted(a, out):
    ids, status = (a[1], a[2]) if len(a) > 2 else (a[1], None)
    if status is None or getattr(status, "name", "") != "FINISHED_ABORTED":
        return {}
    return {"aborted_requests": 1 if isinstance(ids, str) else len(list(ids or ()))}


def _stop_token(a, out):
    r = a[0]
    return {"stop_token_stops": int(bool(out) and isinstance(r.stop_reason, int))}


def _prefix_hit(a, out):
    n = int(out[1])
    return {"prefix_hits": int(n > 0), "prefix_hit_tokens": n}


COUNTERS = {
    "preempt": ("engine", _preempted, None),
    "schedule": ("engine", _scheduled, None),
    "sched_add": ("engine", _added, None),
    "finish": ("engine", _aborted, None),
    "reset_cache": ("engine", "prefix_cache_resets", lambda a, out: bool(out)),
    "check_stop": ("engine", _stop_token, None),
    "prefix_lookup": ("engine", _prefix_hit, None),
    "pause": ("engine", "pauses", None),
    "resume": ("engine", "resumes", None),
    "stop_strings": ("api", "stop_string_stops", lambda a, out: out is not None),
    "parallel_sampling": ("api", "parallel_parents", None),
    "penalties": ("worker", "penalty_steps", lambda a, out: not a[1].no_penalties),
    "bad_words": ("worker", "bad_words_steps", lambda a, out: bool(a[1])),
    "min_tokens": ("worker", "min_tokens_steps", lambda a, out: bool(a[0].min_toks)),
    "logit_bias": ("worker", "logit_bias_steps", lambda a, out: bool(a[0].biases)),
    "batch_condense": ("worker", "seeded_reorders", lambda a, out: bool(a[0].generators)),
    "batch_swap": ("worker", "seeded_reorders", lambda a, out: bool(a[0].generators)),
    "grammar": ("worker", "grammar_steps", None),
}


# -- CUDA's generator rewind, on CPU --------------------------------------------------------
_GEN_STATES: dict = {}  # batch index -> (generator, its state before this step's sample)


def _sampler_forward(orig):
    def forward(self, logits, sampling_metadata, *a, **kw):
        _GEN_STATES.clear()
        for i, g in (sampling_metadata.generators or {}).items():
            if g.device.type == "cpu":
                _GEN_STATES[i] = (g, g.get_state())
        return orig(self, logits, sampling_metadata, *a, **kw)
    return forward


class _Rewind:
    """Stands in for a CPU generator while vLLM rewinds it by offset (a CUDA-only call): the
    rewind restores the state from before the discarded sample, which is what the CUDA rewind
    achieves."""

    def __init__(self, gen, state):
        self.gen, self.state = gen, state

    def get_offset(self):
        return 4

    def set_offset(self, offset):
        if self.state is not None:
            self.gen.set_state(self.state)
            _facts("worker").add("cpu_generator_rewinds")


def _bookkeeping(orig):
    def _bookkeeping_sync(self, *a, **kw):
        gens = self.input_batch.generators
        mask = getattr(getattr(self, "discard_request_mask", None), "np", None)
        if mask is not None and gens:  # path count: seeded samples vLLM discards (a partial prefill)
            n = sum(1 for i in mask[:self.input_batch.num_reqs].nonzero()[0] if int(i) in gens)
            if n:
                _facts("worker").add("seeded_discards", n)
        if "cpu_generator_rewind" in _PLAN.data.get("stock", ()):
            return orig(self, *a, **kw)
        real = {i: g for i, g in gens.items() if isinstance(g, __import__("torch").Generator)
                and g.device.type == "cpu"}
        for i, g in real.items():
            st = _GEN_STATES.get(i)
            gens[i] = _Rewind(g, st[1] if st is not None and st[0] is g else None)
        try:
            return orig(self, *a, **kw)
        finally:
            for i, g in real.items():
                if isinstance(gens.get(i), _Rewind):
                    gens[i] = g
    return _bookkeeping_sync


def _flusher() -> None:
    progress.start_flusher(_FACTS.values)


PATCHES = {
    "platform_config": _platform_config,
    "engine_loop": _engine_loop,
    "engine_step": _engine_step,
    "engine_step_sync": _engine_step_sync,
    "runner_init": _runner_init,
    "worker_execute": _worker_execute,
    "output_copy": _output_copy,
    "before_wait": _before_wait,
    "penalty_ids": _penalty_ids,
    "sampler_forward": _sampler_forward,
    "bookkeeping": _bookkeeping,
}


def register() -> None:
    """vLLM calls this in each of its processes (vllm.plugins.load_general_plugins)."""
    global _PLAN, _INSTALLED
    if _INSTALLED:
        return
    _PLAN = planmod.load()
    if _PLAN is None:
        return  # no plan: inert
    _INSTALLED = True
    _register_stack_dump()
    try:
        for point, make in PATCHES.items():
            _patch(point, make)
        _patch("engine_step", _engine_step_in_flight)
        _patch("engine_step_sync", _engine_step_sync_flag)
        for point, (role, key, when) in COUNTERS.items():
            _patch(point, _counting(role, key, when))
        vllm_steps.install(_patch, _facts)  # each request's steps, for the steps oracle
        _flusher()
    except AgentError as e:
        f = _facts("error")
        f.set(error=str(e))
        f.write(True)
        raise
