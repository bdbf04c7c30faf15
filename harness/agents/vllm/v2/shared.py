"""What the V2 agent shares with the rest of the vLLM agent in one process: the plan and the facts
(harness.agents.vllm.state), the copy engine (harness.agents.vllm.copy_engine: one copy thread and
its host buffers per worker, whichever runner made them), the worker's step clock (delays given in
steps), the forwards it timed and the engine core's thread (harness.agents.vllm.timing). One place,
so the V2 agent reads that state the same way wherever it lives."""
from __future__ import annotations

from harness.agents.vllm import copy_engine, state, timing


def plan():
    return state.PLAN


def facts(role: str):
    return state.facts(role)


def register_stack_dump() -> None:
    state.register_stack_dump()


def copy_engine_():
    """The worker's copy engine, made on its first asynchronous output."""
    if copy_engine.COPY is None:
        copy_engine.COPY = copy_engine.CopyEngine(copy_engine.pipeline_buffers())
    return copy_engine.COPY


def current_copy():
    return copy_engine.COPY


def release_unread(buf, seq: int) -> None:
    copy_engine.release_unread(buf, seq)


def no_wait():
    return copy_engine._NoWait()


def measured(dt: float) -> None:
    timing._measured(dt)


def step_period() -> float:
    return timing.step_period()


def forwards():
    return timing._FORWARDS


def engine_thread():
    return timing.ENGINE_THREAD["id"]


# the worker's own overlap (issue 36, item 4; on V2 for issue 45: the sampling stage of pp2 is V2's):
# the same clock and counts as V1's (harness.agents.vllm.timing.watch_copy / forward_begins)
def copy_started(done) -> None:
    """The newest sampled-id copy: what the next step's forward must not wait for."""
    timing.LAST_COPY[0] = done


def watch_copy() -> None:
    timing.watch_copy()


def forward_begins() -> None:
    timing.forward_begins()
