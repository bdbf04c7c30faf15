"""A queue reader that sleeps between its looks instead of spinning, on CPU (a cost, not a bug).

vLLM's processes hand each step over shared-memory queues (`MessageQueue`: the engine core's
requests to the worker, the worker's outputs back). After every read a reader spins for
`busy_loop_s` = 1 s (SpinCondition.wait, from 0.18.0: `sched_yield` in a loop, re-reading the
queue's written flag each round) before it parks on the writer's notification socket: on a GPU,
where a step takes milliseconds, that saves a wake-up. On CPU the worker's step needs the cores the
reader spins on: each server's engine core spun beside its computing worker at every step, and the
harness runs two servers (the pair) on the same cores, beside the tests: a third of the vLLM pair
chain's CPU (docs/results/2026-12-07-ci-time-4.md).

Installed wherever its point exists (no release fact), only on vLLM's CPU platform: inside that
second the reader sleeps LOOK_S between two looks at the flag instead of yielding; after it, vLLM's
own idle wait. Not the idle wait at once: vLLM's writer drops a notification when the last one has
not left its socket yet (SNDHWM 1), and a reader parked then sleeps until its 5-s recheck (measured:
restarts up to 12 s slower). The flag stays the reader's only source of truth, so no step, order or
token changes: a message is seen at most LOOK_S later. With "reader_spin" under the plan's "stock",
vLLM's spin stays.
"""
from __future__ import annotations

import time

from harness.agents.vllm import state

FACT = None  # installed wherever its point exists
POINT = "reader_wait"
LOOK_S = 0.0005  # between two looks at the written flag: a CPU step takes tens of milliseconds

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
        # inside the reader's spin window (the writer's busy_loop_s is 0: never here); vLLM's caller
        # looks at the flag again when this returns, as after its own yield
        busy = getattr(self, "busy_loop_s", 0)
        if (busy and time.monotonic() <= getattr(self, "last_read", 0) + busy and on_cpu()
                and "reader_spin" not in state.PLAN.data.get("stock", ())):
            time.sleep(LOOK_S)
            return None
        return orig(self, *a, **kw)
    return wait


PATCHES = {POINT: patch}
