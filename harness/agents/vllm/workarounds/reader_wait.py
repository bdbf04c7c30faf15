"""No busy-wait on the shared-memory queues where the servers share the CPU cores (a cost, not a bug).

vLLM's processes hand each step over shared-memory queues (`MessageQueue`: the engine core's
requests to the worker, the worker's outputs back). A reader spins (`sched_yield` in a loop) for
`busy_loop_s` = 1 s after every read before it waits on the writer's notification (SpinCondition,
from 0.18.0): on a GPU, where a step takes milliseconds, that saves a wake-up. On CPU the worker's
step takes the cores the reader spins on: every step of each server paid a spinning engine core
beside its computing worker, and the harness runs two servers (the pair) on the same cores, beside
the tests. Measured (docs/results/2026-12-07-ci-time-4.md): most of the vLLM pair's system CPU.

Turned on by no release fact: installed wherever its point exists (SpinCondition.wait, 0.18.0 on),
and only on vLLM's CPU platform. The reader then takes vLLM's own idle path at once: it polls the
notification socket the writer signals after every write, so it wakes on the message it waited for;
no step, order or token changes, only how the reader sleeps. With "reader_spin" under the plan's
"stock", vLLM's spin stays.
"""
from __future__ import annotations

from harness.agents.vllm import state

FACT = None  # installed wherever its point exists
POINT = "reader_wait"

_ON_CPU: list = []  # the platform's answer, asked once per process


def on_cpu() -> bool:
    """vLLM's platform in this process is its CPU one (asked once)."""
    if not _ON_CPU:
        try:
            from vllm.platforms import current_platform
            _ON_CPU.append(bool(current_platform.is_cpu()))
        except Exception:  # noqa: BLE001 - no platform to ask: leave vLLM's spin alone
            _ON_CPU.append(False)
    return _ON_CPU[0]


def patch(orig):
    def wait(self, *a, **kw):
        # busy_loop_s is the reader's own (the writer's is 0); set once, vLLM's idle path from then on
        if getattr(self, "busy_loop_s", 0) and on_cpu() and "reader_spin" not in state.PLAN.data.get("stock", ()):
            self.busy_loop_s = 0
        return orig(self, *a, **kw)
    return wait


PATCHES = {POINT: patch}
