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
import zlib

from harness.agents import plan as plan_mod
from harness.agents import progress
from harness.agents.host_order import HostOrder
from harness.agents.sglang import books, counters, entry0, faults, fence, timing
from harness.agents.sglang.cuda_ops import CudaOps
from harness.agents.sglang.points import (CATALOGUE, DELAY_POINTS, POINTS_BY_NAME,
                                          WRITTEN_AGAINST)

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

    # -- the fence (harness.agents.sglang.fence) -------------------------------------------------------
    def table_written(self, what: str, ranges) -> None:
        """The scheduler writes req_to_token: judged against the forward steps it is not ordered after."""
        if self.fence is not None:
            from harness.agents.sglang.fence import judge_write
            judge_write(self.fence, self.facts, what, ranges)

    def install_fence_model(self) -> None:
        from harness.agents.sglang.fence import install
        self.fence = install(self.facts, self.originals)

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
        agent, facts = self, self.facts
        facts.set(agent="sglang", written_against=WRITTEN_AGAINST, faults=sorted(self.plan.data.get("faults", ())))

        for name, make in (("forward", lambda orig: timing.forward(agent, orig)), ("delayed_sample", lambda orig: counters.delayed_sample(agent, orig)), ("penalty_cumulate", lambda orig: counters.penalty_cumulate(agent, orig)), ("result_copy", lambda orig: timing.result_copy(agent, orig)),
                           ("run_batch", lambda orig: timing.run_batch(agent, orig)),
                           ("result_wait", lambda orig: timing.result_wait(agent, orig)), ("war_barrier", lambda orig: faults.war_barrier(agent, orig)),
                           ("relay_stash", lambda orig: faults.relay_stash(agent, orig)), ("graph_pad", lambda orig: entry0.graph_pad(agent, orig)), ("retract", lambda orig: counters.retract(agent, orig)),
                           ("table_write", lambda orig: fence.table_write(agent, orig)), ("table_assign", lambda orig: fence.table_assign(agent, orig)),
                           ("finish_in_flight", lambda orig: counters.finish_in_flight(agent, orig)), ("abort", lambda orig: counters.abort(agent, orig)),
                           ("books_idle", lambda orig: books.books_idle(agent, orig)), ("books_leak", lambda orig: books.books_leak(agent, orig))):
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
