"""What the V2 agent shares with the rest of the vLLM agent in one process: the plan and the facts
(harness.agents.vllm.state), the copy engine (one copy thread and two host buffers per worker,
whichever runner made them: copy_engine), the worker's step clock (delays given in steps), the
forwards it timed and the engine core's thread (timing). One place, so the V2 agent reads the
rest of the agent's state the same way wherever that state lives."""
from __future__ import annotations

from harness.agents.vllm import copy_engine as _copy
from harness.agents.vllm import state as _state
from harness.agents.vllm import timing as _timing


def plan():
    return _state.PLAN


def facts(role: str):
    return _state.facts(role)


def register_stack_dump() -> None:
    _state.register_stack_dump()


def copy_engine():
    """The worker's copy engine, made on its first asynchronous output."""
    if _copy.COPY is None:
        _copy.COPY = _copy.CopyEngine()
    return _copy.COPY


def current_copy():
    return _copy.COPY


def no_wait():
    return _copy._NoWait()


def measured(dt: float) -> None:
    _timing._measured(dt)


def step_period() -> float:
    return _timing.step_period()


def forwards():
    return _timing._FORWARDS


def engine_thread():
    return _timing.ENGINE_THREAD["id"]
