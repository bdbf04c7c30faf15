"""V2's sampled-id copy (harness/agents/vllm/v2/agent.py) under three steps in flight, driven as
vLLM's multiprocess worker drives it: the main thread makes each step's AsyncOutput and hands it
to the output thread through a queue; the output thread reads one output at a time, and keeps the
output it read last alive until the next one arrives (`output = queue.get()` in
multiproc_executor.async_output_busy_loop). The engine core lets three steps be in flight at
once (pp2's batch queue: pipeline size + 1).

The issue-45 pp2 finding (docs/results/2026-12-07-pp2-reset-divergence.json) came from here: a dead
output gave its host buffer back unconditionally, after a later copy had taken that buffer, so a
third copy overwrote ids whose reader had not read them yet (the request's tokens came back from
the wrong step). Each output must read its own step's ids, however late its reader is."""
import json
import queue
import threading
import time

import pytest
import torch

from harness.agents import plan as planmod
from harness.agents.vllm import copy_engine, state, timing
from harness.agents.vllm.v2 import agent as v2agent
from harness.targets.vllm import workers


class _Sampled:
    def __init__(self, ids):
        self.sampled_token_ids = ids


class _AsyncOutput:
    """Stands in for vLLM's V2 AsyncOutput: its constructor and reader are wrapped as the agent
    wraps vLLM's (the copy thread, the host buffers and the event are the agent's real ones)."""

    def __init__(self, model_runner_output, sampler_output):
        self.model_runner_output = model_runner_output
        self.sampled_token_ids = sampler_output.sampled_token_ids.numpy()  # vLLM: async_copy_to_np

    def get_output(self):
        time.sleep(0.02)  # a late reader (the before_wait delay, or a busy output thread)
        self.copy_event.synchronize()
        return [list(r) for r in self.sampled_token_ids.tolist()]


@pytest.fixture
def wrapped(fresh_agent, monkeypatch):
    for name, fresh in (("_FWD", {}), ("LAST_COPY", [None]), ("_FWD_COUNTS", {"judged": 0, "after_copy": 0})):
        monkeypatch.setattr(timing, name, fresh)  # the worker's overlap watch: this test's own
    init = v2agent._output_copy(_AsyncOutput.__init__)
    read = v2agent._before_wait(_AsyncOutput.get_output)
    return init, read


def _serve(init, read, steps: int, in_flight: int) -> list:
    """Run `steps` steps through vLLM's two worker threads; the ids each reader got, in order."""
    q: queue.Queue = queue.Queue()
    slots = threading.Semaphore(in_flight)  # the engine core's batch queue
    got: list = []

    def output_thread():  # multiproc_executor.async_output_busy_loop
        while True:
            output = q.get()
            if output is None:
                return
            got.append(read(output))
            slots.release()

    t = threading.Thread(target=output_thread, daemon=True)
    t.start()
    output = None
    for i in range(steps):  # multiproc_executor.worker_busy_loop: `output = func(...)`
        slots.acquire()
        output = _AsyncOutput.__new__(_AsyncOutput)
        init(output, None, _Sampled(torch.tensor([[100 + i], [200 + i]])))
        q.put(output)
    q.put(None)
    t.join(30)
    assert not t.is_alive(), "the output thread did not finish"
    return got


def test_three_steps_in_flight_each_reader_gets_its_own_steps_ids(wrapped):
    init, read = wrapped
    got = _serve(init, read, steps=24, in_flight=3)
    want = [[[100 + i], [200 + i]] for i in range(24)]
    assert got == want
    assert not state.facts("worker").data.get("buffer_overwritten")


def test_one_step_in_flight_never_waits_on_a_buffer(wrapped):
    init, read = wrapped
    assert _serve(init, read, steps=6, in_flight=1) == [[[100 + i], [200 + i]] for i in range(6)]


def test_an_overwritten_buffer_is_the_agents_error_named_by_rank():
    """The target refuses a run in which a worker's copy was overwritten before its read (the fact
    the reader counts), naming the rank; the count before the run is subtracted."""
    w = lambda pid, pp, n: {"role": "worker", "pid": pid, "pp_rank": pp, "pp_size": 2, "tp_rank": 0,  # noqa: E731
                            "tp_size": 1, "rank": pp, "buffer_overwritten": n}
    before = [w(1, 0, 0), w(2, 1, 3)]
    assert workers.overwritten_errors([w(1, 0, 0), w(2, 1, 3)], before) == []
    errs = workers.overwritten_errors([w(1, 0, 0), w(2, 1, 5)], before)
    assert len(errs) == 1 and "rank 1" in errs[0] and "(2 time(s))" in errs[0] and "agent's own error" in errs[0]


def test_the_fault_that_reuses_one_buffer_is_not_counted_as_the_agents_error(wrapped, tmp_path):
    """pinned_buffer_reuse overwrites on purpose (the divergence oracle must catch it): not our error."""
    init, read = wrapped
    (tmp_path / "plan.json").write_text(json.dumps({"facts_dir": str(tmp_path), "release": "0.32.0",
                                                     "faults": ["pinned_buffer_reuse"]}))
    state.PLAN = planmod.Plan(str(tmp_path / "plan.json"))
    _serve(init, read, steps=8, in_flight=3)
    assert not state.facts("worker").data.get("buffer_overwritten")


def test_a_run_the_agent_spoiled_is_refused_by_the_search_never_a_finding():
    """The served search's judge (what stress and replay run) says a run whose agent misbehaved is
    not judged, with the reason, instead of reporting the engine (or ending the search)."""
    from harness.search.served.case import ServedCase
    from harness.search.served.judge import judge
    from harness.targets.base import AgentFault

    class _Pair:  # a served pair whose async-on server's agent overwrote a buffer (the check raises)
        def url(self, overlap):
            return "http://127.0.0.1:1"

        def run(self, reqs, overlap=True, **kw):
            if overlap:
                raise AgentFault("vllm (async on): rank 1 (pp stage 1 of 2): the agent's host buffer ...")
            from harness.targets.base import Run
            return Run([("r0", [1, 2], "length")])

    v = judge(_Pair(), ServedCase([], {}, [], 1), agent=False, claims=False)
    assert v.refused.startswith("the harness's own error: vllm (async on): rank 1")
    assert not v.new


def test_the_copy_engine_has_one_buffer_more_than_the_pipeline_stages(monkeypatch):
    """pipeline_buffers(): PP=2 keeps three steps in flight on V2, so three buffers; PP=3, four; one stage
    (or no pipeline group in the process), two."""
    import sys
    import types

    from harness.agents.vllm import copy_engine
    for pp, want in ((1, 2), (2, 3), (3, 4)):
        mod = types.ModuleType("vllm.distributed.parallel_state")
        mod.get_pp_group = lambda pp=pp: types.SimpleNamespace(world_size=pp)
        monkeypatch.setitem(sys.modules, "vllm.distributed.parallel_state", mod)
        assert copy_engine.pipeline_buffers() == want, pp
    mod = types.ModuleType("vllm.distributed.parallel_state")
    mod.get_pp_group = lambda: (_ for _ in ()).throw(AssertionError("pipeline model parallel group is not initialized"))
    monkeypatch.setitem(sys.modules, "vllm.distributed.parallel_state", mod)
    assert copy_engine.pipeline_buffers() == 2
