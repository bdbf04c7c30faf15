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
from harness.agents.sglang import counters, timing
from harness.agents.sglang.cuda_ops import CudaOps
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

        for name, make in (("forward", lambda orig: timing.forward(agent, orig)), ("delayed_sample", lambda orig: counters.delayed_sample(agent, orig)), ("penalty_cumulate", lambda orig: counters.penalty_cumulate(agent, orig)), ("result_copy", lambda orig: timing.result_copy(agent, orig)),
                           ("run_batch", lambda orig: timing.run_batch(agent, orig)),
                           ("result_wait", lambda orig: timing.result_wait(agent, orig)), ("war_barrier", war_barrier),
                           ("relay_stash", relay_stash), ("graph_pad", graph_pad), ("retract", lambda orig: counters.retract(agent, orig)),
                           ("table_write", table_write), ("table_assign", table_assign),
                           ("finish_in_flight", lambda orig: counters.finish_in_flight(agent, orig)), ("abort", lambda orig: counters.abort(agent, orig)),
                           ("books_idle", books_idle), ("books_leak", books_leak)):
            self._wrap(name, make)
        assert set(DELAY_POINTS) <= set(self.originals)
        if self.plan.data.get("device") == "cpu" and self.plan.data.get("fence_model", True):
            self.install_fence_model()
        facts.set(installed=True, steps=0, tokens_out=0)  # a progress counter from the start: watched
        facts.write(True)
        return self


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
