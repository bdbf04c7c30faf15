"""Where the agent's faults (points.CATALOGUE) act, each the way the bugs of its class did: the
write-after-read barrier skipped, moved before the forward's reads, or followed by a blocking copy
(point `war_barrier`), and the relay's write moved to a stream the next reader does not wait for
(point `relay_stash`). The fence fault's early event is recorded at the launch (timing.run_batch).
The barrier's wrapper also times it on every run, faulted or not: a correct barrier only enqueues
a wait, so host time spent there means the CPU waited for the GPU (overlap lost).
"""
from __future__ import annotations

import time

from harness.agents.sglang.points import BARRIER_BLOCK_MS

RELAY_FAULT_MS = 2.0  # how long the moved relay write is held back (sglang_relay_read_before_write)


def war_barrier(agent, orig):
    ops, facts, fault = agent.ops, agent.facts, agent.plan.fault

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


def relay_stash(agent, orig):
    ops, facts, fault = agent.ops, agent.facts, agent.plan.fault

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
