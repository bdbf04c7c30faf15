"""The agent's installation in each of vLLM's processes: `register()` is the `vllm.general_plugins`
entry point (named `overlap_harness` in pyproject.toml). Without a plan it does nothing. With one
it reads which release it runs in, and the release table's facts there that the target wrote into
the plan (harness.agents.release), and patches, in this order (the order of wrapping where two
patches share a point):
1. timing, the copy engine and the penalty fault at the points that release has (PATCHES);
2. the workarounds whose release fact holds there (harness.agents.vllm.workarounds);
3. the in-flight flags the path counters read, then the path counters (harness.agents.vllm.counters)
   and the rows an allowed-ids mask restricts without asking (harness.agents.vllm.masks);
4. the books at idle, outermost (harness.agents.vllm.books), then each request's steps
   (harness.agents.vllm.steps) and speculative windows (harness.agents.vllm.spec);
and starts the facts flusher. A point the release should have and does not is an AgentError,
written to the "error" facts and raised (vLLM then does not start).
"""
from __future__ import annotations

from harness.agents import plan as planmod
from harness.agents import progress
from harness.agents.vllm import books, copy_engine, counters, cuda_stubs, faults, masks, spec, state, steps, timing
from harness.agents.vllm.points import POINTS_BY_NAME, WRITTEN_AGAINST, patch_at, points_in
from harness.agents.vllm.state import AgentError
from harness.agents.vllm.workarounds import MODULES as WORKAROUND_MODULES

_INSTALLED = False


def _error(detail: str) -> AgentError:
    import vllm
    return AgentError(f"overlap-harness agent: vLLM {getattr(vllm, '__version__', '?')}: {detail}; the agent was "
                      f"written against vLLM {WRITTEN_AGAINST}")


def patch(point: str, make):
    patch_at(POINTS_BY_NAME[point], make, _error)


PATCHES = {
    "platform_config": timing.platform_config,
    "engine_loop": timing.engine_loop,
    "engine_step": timing.engine_step,
    "engine_step_sync": timing.engine_step_sync,
    "runner_init": timing.runner_init,
    "worker_execute": timing.worker_execute,
    "model_forward": timing.model_forward,
    "output_copy": copy_engine.output_copy,
    "before_wait": copy_engine.before_wait,
    "penalty_ids": faults.penalty_ids,
}


def register() -> None:
    """vLLM calls this in each of its processes (vllm.plugins.load_general_plugins)."""
    global _INSTALLED
    if _INSTALLED:
        return
    state.PLAN = planmod.load()
    if state.PLAN is None:
        return  # no plan: inert
    _INSTALLED = True
    state.register_stack_dump()
    try:
        v = state.release()
        rel = state.release_facts()  # the release table's facts there, as the target wrote them into the plan
        from harness.agents.vllm.v2 import runner as v2runner
        runner = v2runner.decide(state.PLAN.data, v)  # the worker's points are that runner's (V2: harness.agents.vllm.v2)
        here = {p.name for p in points_in(v, runner)}
        cuda_stubs.STUB_CUDA["on"] = cuda_stubs.needs_cuda_stubs(rel)
        cuda_stubs.STUB_CUDA["runner"] = cuda_stubs.STUB_CUDA["on"] and rel.works_around("runner_records_default_stream")
        for point, make in PATCHES.items():
            if point in here:
                patch(point, make)
        for w in WORKAROUND_MODULES:
            if w.FACT is None or rel.works_around(w.FACT):
                for point, make in w.PATCHES.items():
                    if point in here:
                        patch(point, make)
        patch("engine_step", counters.engine_step_in_flight)
        patch("engine_step_sync", counters.engine_step_sync_flag)
        for point, (role, key, when) in counters.COUNTERS.items():
            if point in here:  # a release without the point has no such path to count (n/a)
                patch(point, counters.counting(role, key, when))
        for point, make in masks.PATCHES.items():  # the mechanism of vllm#43894, per request
            if point in here:
                patch(point, make)
        for point, make in books.BOOKS.items():  # outermost: a step's books follow its counts
            if point in here:  # a release without the point keeps no such books (said by the oracle)
                patch(point, make)
        steps.install(patch, state.facts)  # each request's steps, for the steps oracle
        for point, make in spec.PATCHES.items():  # speculative windows (a step without drafts: no count)
            if point in here:
                patch(point, make)
        if runner == "v2":
            from harness.agents.vllm.v2 import agent as v2agent
            try:
                v2agent.install(v)
            except v2agent.V2AgentError as e:
                raise AgentError(str(e)) from None
        progress.start_flusher(state.FACTS.values)
    except AgentError as e:
        f = state.facts("error")
        f.set(error=str(e))
        f.write(True)
        raise
