"""The host's order of events and the seeded delays, at the four points of the overlap loop's step:
the forward (`forward`: a delay on the forward stream before the step's attention metadata reads
`req_to_token`), the result copy (`result_copy`: a delay on the copy stream behind the forward;
on SGLang's CPU backend the copy lands later on the agent's copy thread), the launch
(`run_batch`: step N+1 launched) and the host's wait on a step's result (`result_wait`:
Scheduler.process_batch_result, whose result processors block on the step's copy-done event
first). What the overlap oracle judges (harness.agents.host_order, issue 17) and the progress the
target's hang watchdog polls (harness.agents.progress) are written here.
"""
from __future__ import annotations

import time

from harness.agents.host_order import HostOrder
from harness.agents.sglang import counters


def launched(agent, sched, batch, t: int) -> int | None:
    """run_batch is about to launch `batch` (t: monotonic_ns at its entry): its step number in
    the host order, None when nothing is ordered (the normal loop, an empty batch)."""
    if getattr(sched, "_sched_idled", False):  # the loop idled since the last step: no token period
        agent.tokens.delivered(agent.facts, 0, True)
    if not getattr(sched, "enable_overlap", False):
        return None  # the normal loop: nothing overlaps, nothing to order
    if agent.host is None:
        agent.host = HostOrder()
    reqs = getattr(batch, "reqs", None) or ()
    extend = getattr(getattr(batch, "forward_mode", None), "is_extend", None)
    tokens = (getattr(batch, "extend_num_tokens", None) if extend is not None and extend() else None) or len(reqs)
    step = agent.host.scheduled([getattr(r, "rid", id(r)) for r in reqs], tokens if reqs else 0, t)
    if step is not None:
        agent.last_step = step
    return step


def taken(agent, reqs, before: int) -> None:
    """A step's result was processed: the tokens it appended to its requests are progress."""
    n = sum(len(getattr(r, "output_ids", ())) for r in reqs) - before
    agent.tokens.delivered(agent.facts, max(0, n), False)
    if agent.host is not None:
        agent.facts.set(host_order=agent.host.facts(last=96))
    agent.facts.write()  # throttled; the flusher writes the rest within 0.1 s


def forward(agent, orig):
    ops, facts = agent.ops, agent.facts

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


def result_copy(agent, orig):
    ops, facts = agent.ops, agent.facts

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


def run_batch(agent, orig):
    ops, facts, fault = agent.ops, agent.facts, agent.plan.fault

    def run_batch(self, batch, *a, **kw):
        step = launched(agent, self, batch, time.monotonic_ns())
        if agent.fence is not None and not agent.fence.names:
            agent.fence.name_streams(schedule=getattr(self, "schedule_stream", None),
                                     forward=getattr(self, "forward_stream", None),
                                     copy=getattr(self, "copy_stream", None))
        facts.set(enable_overlap=bool(getattr(self, "enable_overlap", False)))
        counters.count_paths(agent, self, batch)
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


def result_wait(agent, orig):
    facts = agent.facts

    def process_batch_result(self, batch, result, *a, **kw):
        host = agent.host
        step = getattr(result, "_oh_step", None) if host is not None else None
        reqs = list(getattr(batch, "reqs", None) or ())
        before = sum(len(getattr(r, "output_ids", ())) for r in reqs)
        done = getattr(result, "copy_done", None)
        if step is not None:
            host.wait_start(step)
            old = agent.last_step is not None and agent.last_step > step
            if old:
                facts.add("path_one_step_old")  # step N's result taken after N+1 was launched
            if getattr(agent, "spec", None) is not None:
                _spec_result(facts, batch, old)
            if done is not None:  # the wait ends when the copy-done event is passed
                result.copy_done = _TimedDone(done, host, step)
        try:
            return orig(self, batch, result, *a, **kw)
        finally:
            if step is not None:
                host.wait_end(step)  # nothing when the copy-done wait already ended it
                if isinstance(getattr(result, "copy_done", None), _TimedDone):
                    result.copy_done = done
            taken(agent, reqs, before)
            if agent.steps is not None:
                agent.steps.processed(reqs)
    return process_batch_result


def _spec_result(facts, batch, old: bool) -> None:
    """A drafter's verify result taken: one step old (after the next step's launch) or not; a
    grammar batch's counted apart (NGRAM syncs on it by design: is_disable_overlap_for_batch)."""
    try:
        if batch.spec_algorithm.is_none() or not batch.forward_mode.is_decode():
            return
        sync = batch.grammar_needs_sync()
    except AttributeError:
        return
    facts.add("spec_results_sync" if sync else "spec_results")
    if old and not sync:
        facts.add("path_spec_one_step_old")


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
