"""What the V2 agent shares with the rest of the vLLM agent in one process: the plan and the facts,
the copy engine (one copy thread and two host buffers per worker, whichever runner made them), the
worker's step clock (delays given in steps), the forwards it timed and the engine core's thread.
One place, so the V2 agent reads the V1 agent's state the same way wherever that state lives."""
from __future__ import annotations


_AGENT: dict = {"module": None}  # the vLLM agent's module (harness.agents.vllm_plugin), bound by its register()


def bind(agent) -> None:
    _AGENT["module"] = agent


def _agent():
    return _AGENT["module"]


def plan():
    return _agent()._PLAN


def facts(role: str):
    return _agent()._facts(role)


def register_stack_dump() -> None:
    _agent()._register_stack_dump()


def copy_engine():
    """The worker's copy engine, made on its first asynchronous output."""
    a = _agent()
    if a._COPY is None:
        a._COPY = a.CopyEngine()
    return a._COPY


def current_copy():
    return _agent()._COPY


def no_wait():
    return _agent()._NoWait()


def measured(dt: float) -> None:
    _agent()._measured(dt)


def step_period() -> float:
    return _agent()._step_period()


def forwards():
    return _agent()._FORWARDS


def engine_thread():
    return _agent()._ENGINE_THREAD["id"]
