"""The SGLang agent: loaded by SGLang itself (entry point group `sglang.srt.plugins`) in every
process that calls `load_plugins()`; it acts only inside scheduler subprocesses and only when
the target handed it a plan (harness/agents/plan.py). Without a plan it does nothing.

On SGLang's CPU backend (the plan's device "cpu") the device operations are
harness.agents.sglang.cpu_ops.CpuOps: a delay holds the scheduler thread back, and the result
copy lands later on a copy thread of the agent (the GPU's asynchrony given back). On a GPU,
delays spin the GPU (`torch.cuda._sleep`) rather than the host, on the stream whose work they
must hold back: on the forward stream before the step's attention metadata reads
`req_to_token` (point `forward`), and on the copy stream, behind the forward, before the
result copy (point `result_copy`). A delay there widens exactly the window a missing or
misplaced fence leaves open, so a fault that a fast GPU hides shows up in the tokens.

Faults (agents.sglang.points.CATALOGUE) rewire SGLang's own fence, copy and relay the way the bugs of
each class did; the patch points come from one table that the contract test checks against
SGLang's source.

It also records what the overlap oracle judges (harness.agents.host_order, issue 17): when
`Scheduler.run_batch` launches step N+1 and when the host waits on step N's result
(`Scheduler.process_batch_result`, whose result processors block on the step's copy-done event
first), and the progress the target's hang watchdog polls (harness.agents.progress).
"""
from __future__ import annotations

import importlib
import random
import sys
import time
import zlib

from harness.agents import plan as plan_mod
from harness.agents import progress
from harness.agents.host_order import HostOrder
from harness.agents.sglang.cuda_ops import CudaOps
from harness.agents.sglang.steps import client_key
from harness.agents.sglang.points import (BARRIER_BLOCK_MS, CATALOGUE, DELAY_POINTS, POINTS_BY_NAME,
                                          WRITTEN_AGAINST)

RELAY_FAULT_MS = 2.0  # how long the moved relay write is held back (sglang_relay_read_before_write)


class AgentError(RuntimeError):
    pass


class SglangAgent:
    def __init__(self, plan, facts, ops, resolve=importlib.import_module, steps=None):
        self.plan, self.facts, self.ops, self.resolve = plan, facts, ops, resolve
        self.steps = steps  # harness.agents.sglang.steps.StepBooks, or None (not counted)
        self.rngs: dict[str, random.Random] = {}
        self.originals: dict[str, tuple[object, str, object]] = {}
        self.host: HostOrder | None = None  # the overlap loop's launch / wait order (overlap on only)
        self.tokens = progress.TokenClock()
        self.extended: set = set()  # request ids whose first extend was seen (a later one is a chunk or a resume)
        self.last_step: int | None = None  # the newest step the overlap loop launched (host order)
        self.fence = None  # harness.agents.sglang.fence.FenceModel: the CPU backend's happens-before
        faults = set(plan.data.get("faults", ()))
        unknown = faults - set(CATALOGUE)
        if unknown:
            raise AgentError(f"unknown SGLang fault {', '.join(sorted(unknown))}; known: {', '.join(CATALOGUE)}")

    # -- the seeded delay policy ----------------------------------------------------------------
    def delay_ms(self, point: str) -> float:
        """The spin (ms) the plan asks for at this point now: seeded per point and per process
        rank, so a run is replayable from its seed."""
        self.plan.reload()
        d = self.plan.data.get("delays", {}).get(point)
        if not d:
            return 0.0
        rng = self.rngs.get(point)
        if rng is None:
            seed = int(self.plan.data.get("seed", 0)) ^ zlib.crc32(f"sglang:{point}".encode())
            rng = self.rngs[point] = random.Random(seed)
        if rng.random() >= float(d.get("p", 1.0)):
            return 0.0
        return float(d.get("ms", 0.0))

    # -- the host's order of events and progress ----------------------------------------------------
    def launched(self, sched, batch, t: int) -> int | None:
        """run_batch is about to launch `batch` (t: monotonic_ns at its entry): its step number in
        the host order, None when nothing is ordered (the normal loop, an empty batch)."""
        if getattr(sched, "_sched_idled", False):  # the loop idled since the last step: no token period
            self.tokens.delivered(self.facts, 0, True)
        if not getattr(sched, "enable_overlap", False):
            return None  # the normal loop: nothing overlaps, nothing to order
        if self.host is None:
            self.host = HostOrder()
        reqs = getattr(batch, "reqs", None) or ()
        extend = getattr(getattr(batch, "forward_mode", None), "is_extend", None)
        tokens = (getattr(batch, "extend_num_tokens", None) if extend is not None and extend() else None) or len(reqs)
        step = self.host.scheduled([getattr(r, "rid", id(r)) for r in reqs], tokens if reqs else 0, t)
        if step is not None:
            self.last_step = step
        return step

    def taken(self, reqs, before: int) -> None:
        """A step's result was processed: the tokens it appended to its requests are progress."""
        n = sum(len(getattr(r, "output_ids", ())) for r in reqs) - before
        self.tokens.delivered(self.facts, max(0, n), False)
        if self.host is not None:
            self.facts.set(host_order=self.host.facts(last=96))
        self.facts.write()  # throttled; the flusher writes the rest within 0.1 s

    # -- the paths, counted on both arms -------------------------------------------------------------
    def count_paths(self, sched, batch) -> None:
        """What a launched step exercises (facts `path_*`): a prefill chunk of a longer prompt, a
        first extend that starts from a cached prefix, a decode step whose input ids come from the
        relay (FutureMap), penalties and grammar that read the newest token."""
        reqs = list(getattr(batch, "reqs", None) or ())
        mode = getattr(batch, "forward_mode", None)
        extend = bool(getattr(mode, "is_extend", lambda: False)())
        facts = self.facts
        if extend:
            chunked = getattr(sched, "chunked_req", None)
            if chunked is not None and any(r is chunked for r in reqs):
                facts.add("path_chunked_prefill")
            for r in reqs:
                rid = getattr(r, "rid", None)
                if rid in self.extended:
                    continue
                self.extended.add(rid)
                if getattr(r, "prefix_len", 0) > 0:
                    facts.add("path_prefix_hit")
        elif getattr(mode, "is_decode", lambda: False)() and reqs:
            facts.add("path_relay_decode")  # step N+1's input ids gathered from step N's relay entries
        info = getattr(batch, "sampling_info", None)
        orch = getattr(info, "penalizer_orchestrator", None)
        if orch is not None and getattr(orch, "is_required", False):
            facts.add("path_penalties")
        if any(getattr(r, "grammar", None) is not None for r in reqs):
            facts.add("path_grammar")

    # -- the fence (harness.agents.sglang.fence) and entry 0 (harness.agents.sglang.entry0) -----------
    def table_written(self, what: str, ranges) -> None:
        """The scheduler writes req_to_token: judged against the forward steps it is not ordered after."""
        if self.fence is not None:
            from harness.agents.sglang.fence import judge_write
            judge_write(self.fence, self.facts, what, ranges)

    def install_fence_model(self) -> None:
        from harness.agents.sglang.fence import install
        self.fence = install(self.facts, self.originals)

    def padded(self, raw, prepared) -> None:
        from harness.agents.sglang.entry0 import padded
        padded(self.facts, self.last_step, raw, prepared)

    # -- patching ---------------------------------------------------------------------------------
    def _owner(self, name: str):
        p = POINTS_BY_NAME[name]
        try:
            mod = self.resolve(p.module)
        except ImportError as e:
            raise AgentError(f"SGLang point {name} ({p.module}:{p.qualname}) cannot be imported: {e}") from None
        owner, attr = mod, p.qualname
        if "." in p.qualname:
            cls, attr = p.qualname.split(".", 1)
            owner = getattr(mod, cls, None)
        if owner is None or not callable(getattr(owner, attr, None)):
            raise AgentError(f"SGLang point {name} ({p.module}:{p.qualname}) is missing: this agent was "
                             f"written against SGLang {WRITTEN_AGAINST}; run tests/test_sglang_contract.py")
        return owner, attr

    def _wrap(self, name: str, make):
        owner, attr = self._owner(name)
        orig = owner.__dict__.get(attr, getattr(owner, attr))
        self.originals[name] = (owner, attr, orig)
        setattr(owner, attr, make(orig))

    def uninstall(self) -> None:
        for owner, attr, orig in self.originals.values():
            setattr(owner, attr, orig)
        self.originals.clear()

    def install(self) -> "SglangAgent":
        agent, ops, facts = self, self.ops, self.facts
        fault = self.plan.fault
        facts.set(agent="sglang", written_against=WRITTEN_AGAINST, faults=sorted(self.plan.data.get("faults", ())))

        def forward(orig):
            def forward_batch_generation(self, *a, **kw):
                ms = agent.delay_ms("forward")
                if ms:  # the current stream is the forward stream (run_batch entered its context)
                    ops.spin(ms)
                    facts.add("forward_delays")
                facts.add("forward_steps")
                facts.write()
                hb = agent.fence
                if hb is None:
                    return orig(self, *a, **kw)
                from harness.agents.sglang.fence import reads_of_batch
                import torch  # the forward reads on the current stream (the overlap loop's forward stream)
                step = hb.forward_begins(reads_of_batch(a[0] if a else kw.get("batch")),
                                         hb.name(torch.cpu.current_stream()))
                try:
                    return orig(self, *a, **kw)
                finally:
                    hb.forward_ends(step)
            return forward_batch_generation

        def result_copy(orig):
            def _copy_result_to_cpu(self, batch_result, batch, *a, **kw):
                ms = agent.delay_ms("result_copy")
                copier = getattr(ops, "copier", None)
                if copier is not None:  # the CPU backend: the copy lands later, on the agent's copy thread
                    out = orig(self, batch_result, batch, *a, **kw)
                    fpos = getattr(getattr(batch_result, "copy_done", None), "_oh_seen", None)
                    done = copier.start(batch_result, ms / 1000.0)
                    if agent.fence is not None:  # the host's wait on it orders what it does next
                        done.on_sync = lambda hb=agent.fence, p=fpos: hb.host_synced(p)
                    facts.add("copies_async")
                    if ms:
                        facts.add("copy_delays")
                    return out
                if ms:  # behind the forward, ahead of the copy SGLang queues next
                    self.copy_stream.wait_stream(self.forward_stream)
                    ops.spin(ms, self.copy_stream)
                    facts.add("copy_delays")
                return orig(self, batch_result, batch, *a, **kw)
            return _copy_result_to_cpu

        def run_batch(orig):
            def run_batch(self, batch, *a, **kw):
                step = agent.launched(self, batch, time.monotonic_ns())
                if agent.fence is not None and not agent.fence.names:
                    agent.fence.name_streams(schedule=getattr(self, "schedule_stream", None),
                                             forward=getattr(self, "forward_stream", None),
                                             copy=getattr(self, "copy_stream", None))
                facts.set(enable_overlap=bool(getattr(self, "enable_overlap", False)))
                agent.count_paths(self, batch)
                if agent.steps is not None:
                    agent.steps.launched(self, batch)
                facts.add("run_batch")
                facts.add("steps")
                facts.write()
                if fault("sglang_fence_before_read"):
                    # recorded before this step's forward is queued: it completes before the
                    # step reads req_to_token, so a fence on it orders nothing that matters
                    self._oh_early_event = ops.record(self.forward_stream)
                result = orig(self, batch, *a, **kw)
                if step is not None:
                    try:  # on the result itself: the loop hands process_batch_result this object
                        result._oh_step = step
                    except (AttributeError, TypeError):
                        pass  # no attribute to carry it: that step's wait is not judged
                return result
            return run_batch

        def result_wait(orig):
            def process_batch_result(self, batch, result, *a, **kw):
                host = agent.host
                step = getattr(result, "_oh_step", None) if host is not None else None
                reqs = list(getattr(batch, "reqs", None) or ())
                before = sum(len(getattr(r, "output_ids", ())) for r in reqs)
                done = getattr(result, "copy_done", None)
                if step is not None:
                    host.wait_start(step)
                    if agent.last_step is not None and agent.last_step > step:
                        facts.add("path_one_step_old")  # step N's result taken after N+1 was launched
                    if done is not None:  # the wait ends when the copy-done event is passed
                        result.copy_done = _TimedDone(done, host, step)
                try:
                    return orig(self, batch, result, *a, **kw)
                finally:
                    if step is not None:
                        host.wait_end(step)  # nothing when the copy-done wait already ended it
                        if isinstance(getattr(result, "copy_done", None), _TimedDone):
                            result.copy_done = done
                    agent.taken(reqs, before)
                    if agent.steps is not None:
                        agent.steps.processed(reqs)
            return process_batch_result

        def war_barrier(orig):
            def barrier(self):
                runner = self.model_worker.last_shared_read_runner
                if fault("sglang_no_war_barrier"):
                    runner.shared_read_done_event = None  # consumed, as the real barrier does
                    facts.add("war_barrier_skipped")
                    return None
                early = getattr(self, "_oh_early_event", None)
                if fault("sglang_fence_before_read") and early is not None:
                    runner.shared_read_done_event = None
                    self._oh_early_event = None
                    self.schedule_stream.wait_event(early)
                    facts.add("fence_moved_early")
                    return None
                out = orig(self)
                if fault("sglang_blocking_copy_schedule"):
                    ops.blocking_read(self.schedule_stream)
                    facts.add("blocking_copies")
                return out

            def _apply_war_barrier(self):
                # only the overlap loop calls the barrier; a correct one only enqueues a wait, so
                # the host time spent here says whether the CPU ended up waiting for the GPU
                t = time.perf_counter()
                try:
                    return barrier(self)
                finally:
                    facts.add("war_barrier_calls")
                    if (time.perf_counter() - t) * 1000.0 > BARRIER_BLOCK_MS:
                        facts.add("barrier_blocked")
            return _apply_war_barrier

        def graph_pad(orig):
            def prepare_replay(self, forward_batch, *a, **kw):
                out = orig(self, forward_batch, *a, **kw)
                agent.padded(forward_batch, out)
                return out
            return prepare_replay

        def relay_stash(orig):
            def stash(self, future_indices, payload, *a, **kw):
                if not fault("sglang_relay_read_before_write"):
                    return orig(self, future_indices, payload, *a, **kw)
                side = ops.side_stream()
                side.wait_stream(ops.current_stream())  # the values exist; the next reader is not told
                ops.keep_alive([future_indices, getattr(payload, "bonus_tokens", None)], side)
                ops.spin(RELAY_FAULT_MS, side)
                with ops.stream(side):
                    out = orig(self, future_indices, payload, *a, **kw)
                facts.add("relay_writes_moved")
                return out
            return stash

        def table_write(orig):
            def write(self, indices, values, *a, **kw):
                agent.table_written("write", lambda: __import__("harness.agents.sglang.fence", fromlist=["x"])
                                    .ranges_of_write(indices, values))
                return orig(self, indices, values, *a, **kw)
            return write

        def table_assign(orig):
            def assign_req_to_token_pool_func(req_pool_indices, req_to_token, start_offset, end_offset, *a, **kw):
                agent.table_written("assign", lambda: __import__("harness.agents.sglang.fence", fromlist=["x"])
                                    .ranges_of_assign(req_pool_indices, start_offset, end_offset))
                return orig(req_pool_indices, req_to_token, start_offset, end_offset, *a, **kw)
            return assign_req_to_token_pool_func

        def retract(orig):
            def retract_decode(self, *a, **kw):
                out = orig(self, *a, **kw)
                n = len(out[0]) if isinstance(out, tuple) and out and isinstance(out[0], list) else 0
                if n:
                    facts.add("path_retraction", n)
                    if agent.steps is not None:
                        agent.steps.retracted(out[0])
                return out
            return retract_decode

        def finish_in_flight(orig):
            def _reqs_finishing_inflight(self, batch, *a, **kw):
                out = orig(self, batch, *a, **kw)
                if out:
                    facts.add("path_finish_in_flight", len(out))
                return out
            return _reqs_finishing_inflight

        def abort(orig):
            def abort_request(self, recv_req, *a, **kw):
                rid = getattr(recv_req, "rid", None)
                queued = [b for b, _ in (getattr(self, "result_queue", None) or ())]

                def holds(batches):
                    return bool(rid) and any(str(getattr(r, "rid", "")).startswith(rid) for b in batches
                                             if b is not None for r in (getattr(b, "reqs", None) or ()))
                if holds(queued + [getattr(self, "running_batch", None)]):
                    facts.add("path_abort_running")
                if holds(queued):  # a launched step whose result is not processed yet: in flight
                    facts.add("path_abort_in_flight")
                return orig(self, recv_req, *a, **kw)
            return abort_request

        def books_idle(orig):
            def _check_req_pool(self, *a, **kw):
                # SGLang's own check at full idle: the rows back, and every leak its checks reported
                pool = self.req_to_token_pool
                total = int(getattr(pool, "size", 0)) + int(getattr(pool, "pre_alloc_size", 0) or 0)
                facts.add("books_idle_checks")
                facts.set(books={"req_rows_total": total, "req_rows_free": len(pool.free_slots),
                                 "pool_leaks": facts.data.get("pool_leaks", 0),
                                 "first_leak": facts.data.get("first_leak", "")})
                facts.write()
                return orig(self, *a, **kw)
            return _check_req_pool

        def books_leak(orig):
            def _report_leak(self, pool_name, token_msg, *a, **kw):
                facts.add("pool_leaks")
                if not facts.data.get("first_leak"):
                    facts.set(first_leak=f"{pool_name}: {str(token_msg)[:300]}")
                facts.write(True)
                return orig(self, pool_name, token_msg, *a, **kw)
            return _report_leak

        def penalty_cumulate(orig):
            def cumulate_penalty_output_tokens(self, *a, **kw):
                # the token each request's penalties take in now is req.output_ids[-1]: one step old
                # when the previous step's token is still in flight (its result not processed yet),
                # i.e. when the request's tokens so far do not exceed what its KV already covers
                try:
                    seq = [int(x) for x in self.seq_lens_cpu.tolist()]
                    for r, n in zip(self.reqs, seq):
                        if len(getattr(r, "origin_input_ids", ()) or ()) + len(getattr(r, "output_ids", ())) <= n:
                            facts.add("penalty_stale_tokens")
                            key = client_key(r)
                            if key:
                                with facts._lock:  # the flusher serialises facts.data on its thread
                                    by = facts.data.setdefault("penalty_stale_by_req", {})
                                    if key in by or len(by) < 4096:
                                        by[key] = by.get(key, 0) + 1
                except (AttributeError, TypeError, ValueError):
                    pass
                return orig(self, *a, **kw)
            return cumulate_penalty_output_tokens

        def delayed_sample(orig):
            def launch_batch_sample_if_needed(self, batch_result, *a, **kw):
                if batch_result is not None and getattr(batch_result, "delay_sample_func", None) is not None:
                    facts.add("path_delayed_sample")  # sampled after the previous token reached the grammar
                return orig(self, batch_result, *a, **kw)
            return launch_batch_sample_if_needed

        for name, make in (("forward", forward), ("delayed_sample", delayed_sample), ("penalty_cumulate", penalty_cumulate), ("result_copy", result_copy),
                           ("run_batch", run_batch),
                           ("result_wait", result_wait), ("war_barrier", war_barrier),
                           ("relay_stash", relay_stash), ("graph_pad", graph_pad), ("retract", retract),
                           ("table_write", table_write), ("table_assign", table_assign),
                           ("finish_in_flight", finish_in_flight), ("abort", abort),
                           ("books_idle", books_idle), ("books_leak", books_leak)):
            self._wrap(name, make)
        assert set(DELAY_POINTS) <= set(self.originals)
        if self.plan.data.get("device") == "cpu" and self.plan.data.get("fence_model", True):
            self.install_fence_model()
        from harness.agents.sglang import spec
        algo = spec.spec_algorithm_of_process()
        if algo:  # a drafter: its steps, windows and bonus tokens counted and judged (agents/sglang/spec.py)
            self.spec = spec.install(self, algo)
        facts.set(installed=True, steps=0, tokens_out=0)  # a progress counter from the start: watched
        facts.write(True)
        return self


class _TimedDone:
    """Step N's copy-done event (a CUDA event or SGLang's HostCopyDone), unchanged but for
    noting when the host's wait on it ends; put in place only while its result is processed."""

    def __init__(self, done, host: HostOrder, step: int):
        self._done, self._host, self._step = done, host, step

    def synchronize(self, *a, **kw):
        try:
            return self._done.synchronize(*a, **kw)
        finally:
            self._host.wait_end(self._step)

    def __getattr__(self, name):
        return getattr(self._done, name)


def _in_scheduler_process() -> bool:
    """register() runs in every SGLang process that loads plugins; only the scheduler
    subprocesses (entered through run_scheduler_process) own the streams the agent patches."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "run_scheduler_process":
            return True
        f = f.f_back
    return False


_AGENT: SglangAgent | None = None


def register() -> None:
    """The `sglang.srt.plugins` entry point. Inert without a plan, and outside schedulers."""
    global _AGENT
    plan = plan_mod.load()
    if plan is None or plan.data.get("engine", "sglang") != "sglang" or _AGENT is not None:
        return
    if not _in_scheduler_process():
        return
    facts = plan_mod.Facts(plan.data.get("facts_dir"), "sglang-scheduler")
    try:
        ops = CudaOps()
        if plan.data.get("device") == "cpu":
            from harness.agents.sglang.cpu_ops import CpuOps
            ops = CpuOps()
        facts.set(device=plan.data.get("device", "cuda"))
        from harness.agents.sglang.steps import StepBooks
        steps_facts = plan_mod.Facts(plan.data.get("facts_dir"), "steps")
        _AGENT = SglangAgent(plan, facts, ops, steps=StepBooks(steps_facts)).install()
        progress.register_stack_dump(plan.data.get("facts_dir"))  # for a HANG report
        progress.start_flusher(lambda: (facts, steps_facts))
    except AgentError as e:
        facts.set(error=str(e))
        facts.write(True)
        raise
