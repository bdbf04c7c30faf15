"""The fence model (harness.agents.sglang.fence) on its own and through PyTorch's CPU streams and
events as the agent patches them: it flags a req_to_token write that overlaps the reads of a
forward step it is not ordered after (no barrier; a read-done event recorded before the reads),
and stays quiet where SGLang's barrier, or a host wait on the step's copy, orders it. No server:
tests/test_sglang_pair.py runs it inside SGLang."""
import pytest
import torch

from harness.agents import plan as plan_mod
from harness.agents.sglang.fence import FenceModel, ranges_of_assign, ranges_of_write


@pytest.fixture
def facts(tmp_path):
    return plan_mod.Facts(str(tmp_path), "sglang-scheduler")


def _step(hb, rows):
    n = hb.forward_begins(rows)
    hb.forward_ends(n)
    return n


class Ev:
    pass


def test_the_barrier_orders_the_write(facts):
    hb = FenceModel(facts)
    _step(hb, {5: 10})
    hb.waited_stream("schedule", "forward")  # SGLang's coarse barrier
    assert hb.write("schedule", [(5, 0, 3)], "prefill") == []
    assert facts.data["fence_ordered_conflicts"] == 1 and not facts.data.get("fence_hazards")


def test_no_barrier_is_a_hazard_with_step_and_row(facts):
    hb = FenceModel(facts)
    _step(hb, {5: 10, 6: 4})
    out = hb.write("schedule", [(7, 0, 2), (5, 2, 3)], "prefill")
    assert len(out) == 1 and "row 5 [2, 3)" in out[0] and "forward step 1" in out[0], out
    assert facts.data["fence_hazards"] == 1 and "row 5" in facts.data["first_fence_hazard"]


def test_a_read_done_event_recorded_before_the_reads_orders_nothing(facts):
    hb = FenceModel(facts)
    early, late = Ev(), Ev()
    hb.recorded(early, "forward")  # before the step's forward reads
    n = hb.forward_begins({3: 8})
    hb.forward_ends(n)
    hb.waited_event("schedule", early)
    assert hb.write("schedule", [(3, 0, 8)], "prefill")
    hb.recorded(late, "forward")  # after them: what the fence must wait on
    hb.waited_event("schedule", late)
    assert hb.write("schedule", [(3, 0, 8)], "prefill") == []


def test_a_host_wait_on_the_steps_copy_orders_it(facts):
    hb = FenceModel(facts)
    _step(hb, {5: 10})
    done = Ev()
    hb.waited_stream("copy", "forward")  # the copy stream waits for the forward, then records copy-done
    hb.recorded(done, "copy")
    hb.host_synced(done._oh_seen)  # the result processor waits on it
    assert hb.write("schedule", [(5, 0, 10)], "prefill") == []
    assert not facts.data.get("fence_ordered_conflicts")  # nothing was in flight


def test_disjoint_cells_and_forward_stream_writes_are_not_judged_hazards(facts):
    hb = FenceModel(facts)
    _step(hb, {5: 10})
    assert hb.write("schedule", [(5, 10, 11)], "decode") == []  # the next position: not read by the step
    assert hb.write("forward", [(5, 0, 10)], "decode") == []  # ordered by the stream itself


def test_the_normal_loop_forward_on_the_schedule_stream_orders_its_writes(facts):
    """Overlap off, SGLang runs the forward on the schedule stream itself: the next write is
    behind it in stream order (the first gate run flagged 341 such writes before this was modelled)."""
    hb = FenceModel(facts)
    n = hb.forward_begins({5: 10}, "schedule")
    hb.forward_ends(n)
    assert hb.write("schedule", [(5, 0, 10)], "prefill") == []
    assert hb.write("copy", [(5, 0, 10)], "prefill")  # another stream that never waited: not ordered


def test_write_and_assign_cells():
    assert ranges_of_write((4, slice(2, 9)), None) == [(4, 2, 9)]
    assert ranges_of_write((torch.tensor([1, 2]), torch.tensor([7, 3])), None) == [(1, 7, 8), (2, 3, 4)]
    assert ranges_of_assign(torch.tensor([1, 2]), torch.tensor([0, 5]), torch.tensor([4, 5])) == [(1, 0, 4)]


def test_through_pytorchs_cpu_streams_as_the_agent_patches_them(tmp_path):
    """The fence model the agent installs (fence.install) on the real torch.cpu classes: SGLang's order of calls
    (forward on its stream, barrier, next write on the schedule stream), then restored."""
    from tests.test_sglang_agent import make_agent
    agent, *_ = make_agent(tmp_path, device="cpu")
    hb = agent.fence
    assert hb is not None
    sched, fwd = torch.cpu.Stream(), torch.cpu.Stream()
    hb.name_streams(schedule=sched, forward=fwd)
    try:
        with torch.cpu.StreamContext(fwd):
            n = hb.forward_begins({9: 6})
            read_done = torch.cpu.Event()
            hb.forward_ends(n)
            read_done.record()  # on the forward stream, after the reads
        with torch.cpu.StreamContext(sched):
            agent.table_written("write", lambda: [(9, 0, 6)])
            assert agent.facts.data.get("fence_hazards") == 1  # no barrier yet
            sched.wait_event(read_done)
            agent.table_written("write", lambda: [(9, 0, 6)])
            assert agent.facts.data.get("fence_hazards") == 1 and agent.facts.data["fence_ordered_conflicts"] == 1
    finally:
        agent.uninstall()
    for f in (torch.cpu.Stream.wait_event, torch.cpu.Stream.wait_stream, torch.cpu.Event.record,
              torch.cpu.Event.synchronize):  # PyTorch's own again
        assert f.__module__ == "torch.cpu" and "<locals>" not in f.__qualname__, f.__qualname__
