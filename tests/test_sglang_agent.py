"""The SGLang agent's wiring, on CPU. SGLang's scheduler cannot be imported without a CUDA
torch, so the agent is installed here onto stand-in classes with the signatures the contract
test checks against SGLang's source, and its device operations are recorded instead of run.
What this proves: inert without a plan; delays land on the right stream before the right call,
seeded; each fault rewires the fence / copy / relay as its catalogue entry says. What it cannot
prove (the GPU test at the bottom and `check --target sglang` do): that SGLang's tokens change."""
import inspect
import json
import subprocess
import sys
import types

import pytest

from harness.agents import plan as plan_mod
from harness.agents.sglang import install as sglang_agent
from harness.agents.sglang.install import AgentError, SglangAgent
from harness.agents.sglang.points import POINTS_BY_NAME


class Ops:
    def __init__(self):
        self.log = []

    def spin(self, ms, stream=None):
        self.log.append(("spin", ms, stream))

    def record(self, stream):
        ev = ("event", stream, len(self.log))
        self.log.append(("record", stream))
        return ev

    def current_stream(self):
        return "forward"

    def side_stream(self):
        return Stream("side", self.log)

    def stream(self, s):
        log = self.log

        class Ctx:
            def __enter__(self):
                log.append(("enter", s.name))

            def __exit__(self, *a):
                log.append(("exit", s.name))
        return Ctx()

    def keep_alive(self, tensors, stream):
        self.log.append(("keep_alive", stream.name))

    def blocking_read(self, stream):
        self.log.append(("blocking_read", stream.name))


class Stream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_event(self, ev):
        self.log.append(("wait_event", self.name, ev))

    def wait_stream(self, other):
        self.log.append(("wait_stream", self.name, getattr(other, "name", other)))


def stand_ins(log):
    """Modules shaped like SGLang 0.5.23's at the patch points (signatures checked below)."""
    class Runner:
        shared_read_done_event = "read_done"

    class Worker:
        last_shared_read_runner = Runner()

    class Scheduler:
        enable_overlap = True

        def __init__(self):
            self.schedule_stream = Stream("schedule", log)
            self.forward_stream = Stream("forward", log)
            self.copy_stream = Stream("copy", log)
            self.model_worker = Worker()

        def _apply_war_barrier(self):
            log.append(("orig_war_barrier",))
            ev = self.model_worker.last_shared_read_runner.shared_read_done_event
            self.schedule_stream.wait_event(ev)

        def run_batch(self, batch, pp_proxy_tensors=None):
            log.append(("orig_run_batch", batch))
            return self.make_result() if hasattr(self, "make_result") else "result"

        def _copy_result_to_cpu(self, batch_result, batch):
            log.append(("orig_copy", batch_result))

        def _reqs_finishing_inflight(self, batch):
            return []

        def abort_request(self, recv_req):
            log.append(("orig_abort", recv_req))

        def launch_batch_sample_if_needed(self, batch_result, cur_batch):
            log.append(("orig_delayed_sample", batch_result))

        def process_batch_result(self, batch, result):
            log.append(("orig_process", result))
            if getattr(result, "copy_done", None) is not None:
                result.copy_done.synchronize()  # as SGLang's result processors do first
            for r in batch.reqs:
                r.output_ids.append(7)

    class TpModelWorker:
        def forward_batch_generation(self, batch, forward_batch=None):
            log.append(("orig_forward", batch))
            return "out"

    class FutureMap:
        def stash(self, future_indices, payload):
            log.append(("orig_stash", future_indices))

    class ScheduleBatch:
        def retract_decode(self):
            return [], 0.0, []

        def cumulate_penalty_output_tokens(self):
            log.append(("orig_cumulate", len(self.reqs)))

    class CPUGraphRunner:
        def prepare_replay(self, forward_batch, skip=False):
            return forward_batch if forward_batch.batch_size == 4 else self.padded_to_4(forward_batch)

    class ReqToTokenPool:
        def write(self, indices, values):
            log.append(("orig_table_write", indices))

    def assign_req_to_token_pool_func(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                      batch_size):
        log.append(("orig_table_assign",))

    class SchedulerInvariantChecker:
        def _check_req_pool(self):
            pass

        def _report_leak(self, pool_name, token_msg):
            pass

    mods = {"sglang.srt.managers.scheduler": types.SimpleNamespace(Scheduler=Scheduler),
            "sglang.srt.managers.schedule_batch": types.SimpleNamespace(ScheduleBatch=ScheduleBatch),
            "sglang.srt.managers.scheduler_components.invariant_checker":
                types.SimpleNamespace(SchedulerInvariantChecker=SchedulerInvariantChecker),
            "sglang.srt.managers.tp_worker": types.SimpleNamespace(TpModelWorker=TpModelWorker),
            "sglang.srt.managers.overlap_utils": types.SimpleNamespace(FutureMap=FutureMap),
            "sglang.srt.model_executor.cpu_graph_runner": types.SimpleNamespace(CPUGraphRunner=CPUGraphRunner),
            "sglang.srt.mem_cache.memory_pool": types.SimpleNamespace(ReqToTokenPool=ReqToTokenPool),
            "sglang.srt.mem_cache.allocation":
                types.SimpleNamespace(assign_req_to_token_pool_func=assign_req_to_token_pool_func)}
    return mods, Scheduler, TpModelWorker, FutureMap


def make_agent(tmp_path, **plan):
    p = tmp_path / "plan.json"
    plan_mod.write_plan(str(p), {"seed": 0, "facts_dir": str(tmp_path), **plan})
    ops = Ops()
    mods, sched, worker, fmap = stand_ins(ops.log)

    def resolve(name):
        if name not in mods:
            raise ImportError(f"No module named {name!r}")
        return mods[name]
    facts = plan_mod.Facts(str(tmp_path), "sglang-scheduler")
    agent = SglangAgent(plan_mod.Plan(str(p)), facts, ops, resolve).install()
    return agent, ops, sched(), worker(), fmap(), facts


def names(log):
    return [e[0] for e in log]


def test_stand_ins_have_the_contracts_signatures():
    log = []
    mods, *_ = stand_ins(log)
    for name in ("war_barrier", "run_batch", "result_copy", "forward", "relay_stash", "result_wait", "graph_pad"):
        p = POINTS_BY_NAME[name]
        cls, meth = p.qualname.split(".")
        params = tuple(inspect.signature(getattr(getattr(mods[p.module], cls), meth)).parameters)
        assert params[:len(p.params)] == p.params, name


def test_the_table_wraps_its_points_in_order_each_by_the_module_of_its_question(tmp_path):
    """install() walks WRAPPERS, one wrapper per point of the contract table, each a named
    function of a question's module (never install's own), and what sits at each point is the
    wrapper its row names, bearing the name of the function it wraps (a row that pairs a point
    with another point's wrapper fails here)."""
    from harness.agents.sglang.install import WRAPPERS
    agent, *_ = make_agent(tmp_path)
    names = [n for n, _ in WRAPPERS]
    assert len(set(names)) == len(names) and set(names) <= set(POINTS_BY_NAME)
    assert list(agent.originals) == names  # no fence model off the CPU: the table alone
    for name, make in WRAPPERS:
        owner, attr, _ = agent.originals[name]
        assert make.__module__ != sglang_agent.__name__ and make.__module__.startswith("harness.agents.sglang.")
        now = getattr(owner, attr)  # the point's wrapper is the one its row makes, named as what it wraps
        assert now.__module__ == make.__module__ and now.__qualname__.startswith(f"{make.__name__}.<locals>."), name
        assert now.__name__ == attr, name
    agent.uninstall()


def test_no_plan_no_patching(monkeypatch):
    monkeypatch.delenv(plan_mod.ENV, raising=False)
    sglang_agent.register()
    assert sglang_agent._AGENT is None and not any(m.startswith("sglang") for m in sys.modules)


def test_outside_a_scheduler_process_it_stays_out(tmp_path, monkeypatch):
    p = tmp_path / "plan.json"
    plan_mod.write_plan(str(p), {"faults": ["sglang_no_war_barrier"]})
    monkeypatch.setenv(plan_mod.ENV, str(p))
    sglang_agent.register()  # called from pytest, not from run_scheduler_process
    assert sglang_agent._AGENT is None and not any(m.startswith("sglang") for m in sys.modules)


def test_in_a_scheduler_process_without_sglang_the_agent_names_the_point(tmp_path):
    """In a scheduler process with a plan but without SGLang, the agent names the point."""
    p = tmp_path / "plan.json"
    plan_mod.write_plan(str(p), {"facts_dir": str(tmp_path)})
    code = ("import harness.agents.sglang.install as a\n"
            "def run_scheduler_process():\n    a.register()\n"
            "try:\n    run_scheduler_process()\nexcept a.AgentError as e:\n    print('refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, plan_mod.ENV: str(p)})
    assert "refused: SGLang point forward (sglang.srt.managers.tp_worker" in r.stdout, r.stdout + r.stderr
    facts = json.loads(next(tmp_path.glob("sglang-scheduler-*.json")).read_text())
    assert "cannot be imported" in facts["error"]


def test_correct_plan_keeps_sglangs_fence(tmp_path):
    agent, ops, s, w, f, facts = make_agent(tmp_path)
    assert s.run_batch("b") == "result"
    s._apply_war_barrier()
    assert names(ops.log) == ["orig_run_batch", "orig_war_barrier", "wait_event"]
    assert ops.log[-1] == ("wait_event", "schedule", "read_done")
    assert w.forward_batch_generation("b") == "out" and not any(e[0] == "spin" for e in ops.log)
    agent.uninstall()


def test_delays_spin_the_right_stream_before_the_right_call(tmp_path):
    agent, ops, s, w, f, _ = make_agent(tmp_path, delays={"forward": {"p": 1.0, "ms": 3},
                                                         "result_copy": {"p": 1.0, "ms": 2}})
    w.forward_batch_generation("b")
    assert ops.log[:2] == [("spin", 3.0, None), ("orig_forward", "b")]  # current stream: forward
    ops.log.clear()
    s._copy_result_to_cpu("res", "b")
    assert ops.log[0] == ("wait_stream", "copy", "forward")  # behind the forward ...
    assert ops.log[1][:2] == ("spin", 2.0) and ops.log[1][2].name == "copy"  # ... on the copy stream
    assert ops.log[2] == ("orig_copy", "res")
    agent.uninstall()


def test_delay_policy_is_seeded(tmp_path):
    def decisions(seed):
        a, *_ = make_agent(tmp_path, seed=seed, delays={"forward": {"p": 0.5, "ms": 1}})
        out = [a.delay_ms("forward") for _ in range(64)]
        a.uninstall()
        return out
    assert decisions(1) == decisions(1)
    assert decisions(1) != decisions(2)
    assert 10 < sum(decisions(1)) < 54


def test_fault_no_war_barrier(tmp_path):
    agent, ops, s, *_ , facts = make_agent(tmp_path, faults=["sglang_no_war_barrier"])
    s._apply_war_barrier()
    assert "orig_war_barrier" not in names(ops.log) and "wait_event" not in names(ops.log)
    assert s.model_worker.last_shared_read_runner.shared_read_done_event is None
    assert facts.data["war_barrier_skipped"] == 1
    agent.uninstall()


def test_fault_fence_before_read(tmp_path):
    agent, ops, s, *_ = make_agent(tmp_path, faults=["sglang_fence_before_read"])
    s.run_batch("b")
    s._apply_war_barrier()
    rec = ops.log.index(("record", s.forward_stream))
    assert rec < names(ops.log).index("orig_run_batch")  # recorded before the step is queued
    wait = [e for e in ops.log if e[0] == "wait_event"]
    assert len(wait) == 1 and wait[0][2][0] == "event" and wait[0][2][1] is s.forward_stream
    assert "orig_war_barrier" not in names(ops.log)
    agent.uninstall()


def test_fault_blocking_copy_on_the_schedule_stream(tmp_path):
    agent, ops, s, *_ = make_agent(tmp_path, faults=["sglang_blocking_copy_schedule"])
    s._apply_war_barrier()
    assert names(ops.log) == ["orig_war_barrier", "wait_event", "blocking_read"]
    assert ops.log[-1] == ("blocking_read", "schedule")
    agent.uninstall()


def test_fault_relay_read_before_write(tmp_path):
    agent, ops, s, w, f, _ = make_agent(tmp_path, faults=["sglang_relay_read_before_write"])
    f.stash("idx", types.SimpleNamespace(bonus_tokens=None))
    n = names(ops.log)
    assert n == ["wait_stream", "keep_alive", "spin", "enter", "orig_stash", "exit"]
    assert ops.log[0] == ("wait_stream", "side", "forward") and ops.log[3] == ("enter", "side")
    agent.uninstall()


def test_unknown_fault_and_missing_point(tmp_path):
    with pytest.raises(AgentError, match="unknown SGLang fault nope"):
        make_agent(tmp_path, faults=["nope"])
    p = tmp_path / "plan.json"
    plan_mod.write_plan(str(p), {})
    mods, *_ = stand_ins([])
    del mods["sglang.srt.managers.overlap_utils"].FutureMap
    a = SglangAgent(plan_mod.Plan(str(p)), plan_mod.Facts(None, "x"), Ops(), lambda n: mods[n])
    with pytest.raises(AgentError, match=r"relay_stash \(sglang.srt.managers.overlap_utils:FutureMap.stash\) is missing"):
        a.install()
    a.uninstall()


def test_uninstall_restores(tmp_path):
    agent, ops, s, w, *_ = make_agent(tmp_path, faults=["sglang_no_war_barrier"])
    cls = type(s)
    patched = cls._apply_war_barrier
    agent.uninstall()
    assert cls._apply_war_barrier is not patched
    cls()._apply_war_barrier()
    assert "orig_war_barrier" in names(ops.log)


def test_host_order_records_launch_and_wait_and_restores_copy_done(tmp_path):
    """The overlap loop's order (launch N+1, then take N's result) through the agent's wrappers;
    the copy-done event it timed is SGLang's own again afterwards; the normal loop has no order."""
    class Done:
        def synchronize(self):
            pass
    reqs = [types.SimpleNamespace(rid=f"r{i}", output_ids=[]) for i in range(3)]
    batch = types.SimpleNamespace(reqs=reqs, forward_mode=types.SimpleNamespace(is_extend=lambda: False))
    agent, ops, s, *_, facts = make_agent(tmp_path)
    s.make_result = lambda: types.SimpleNamespace(copy_done=Done())
    pending = None
    for _ in range(6):
        res = s.run_batch(batch)
        if pending is not None:
            done = pending.copy_done
            s.process_batch_result(batch, pending)
            assert pending.copy_done is done and isinstance(done, Done)
        pending = res
    c = agent.host.counts
    assert (c["scheduled"], c["overlapped"], c["early"]) == (6, 5, 0), c
    assert facts.data["tokens_out"] == 5 * 3 and facts.data["host_order"]["waits"] == 5
    assert [e[0] for e in agent.host.events].count("waited") == 5  # each wait ended at synchronize
    agent.uninstall()
    off, _, s2, *_ = make_agent(tmp_path)
    s2.enable_overlap = False
    s2.make_result = s.make_result
    s2.process_batch_result(batch, s2.run_batch(batch))
    assert off.host is None
    off.uninstall()


def test_a_penalty_token_one_step_old_is_counted_per_request(tmp_path):
    """The evidence of KNOWN sglang-penalty-one-step-old: a request whose tokens so far do not exceed
    what its KV covers (its newest token still in flight) has its penalties take an old token."""
    import torch
    from harness.agents.vllm.steps import request_key
    agent, ops, *_, facts = make_agent(tmp_path)
    B = agent.resolve("sglang.srt.managers.schedule_batch").ScheduleBatch
    sp = types.SimpleNamespace(max_new_tokens=8, repetition_penalty=1.3, frequency_penalty=0.0, presence_penalty=0.0)
    plain = types.SimpleNamespace(max_new_tokens=8, repetition_penalty=1.0, frequency_penalty=0.0,
                                  presence_penalty=0.0, min_new_tokens=4)
    late = types.SimpleNamespace(origin_input_ids=[1, 2, 3], output_ids=[], sampling_params=sp)
    fresh = types.SimpleNamespace(origin_input_ids=[4, 5], output_ids=[9], sampling_params=sp)
    # issue 44: batched with a penalised request, in flight too, but no penalty reads its token ids
    # (min_new_tokens counts tokens only): not evidence for it
    bystander = types.SimpleNamespace(origin_input_ids=[6, 7], output_ids=[], sampling_params=plain)
    b = B()
    b.reqs = [late, fresh, bystander]
    b.seq_lens_cpu = torch.tensor([3, 2, 2])  # late: 3 prompt tokens, none of its own yet; fresh: 2 + 1
    b.cumulate_penalty_output_tokens()
    assert ("orig_cumulate", 3) in ops.log
    assert facts.data["penalty_stale_tokens"] == 1
    assert facts.data["penalty_stale_by_req"] == {request_key([1, 2, 3], 8): 1}
    agent.uninstall()


def _graph_batch(rows, locs, bs=None):
    import torch
    return types.SimpleNamespace(batch_size=bs or len(rows), req_pool_indices=torch.tensor(rows),
                                 out_cache_loc=torch.tensor(locs))


@pytest.mark.parametrize("pad_rows,pad_locs,on0,bad", [
    ([0], [0], 1, None),  # SGLang's: the padded row on entry 0 (req row 0, KV slot 0)
    ([7], [0], 0, "point at req rows [7] (live [7])"),  # a live request's row
    ([0], [41], 0, "KV slots [41] (live [41])"),  # a live request's KV slot
])
def test_padded_rows_must_be_entry_0(tmp_path, pad_rows, pad_locs, on0, bad):
    """The CPU graph runner pads a 3-row decode batch to the captured 4: the padded row is counted
    on entry 0 (path_relay_entry0), or reported with the rows and slots it points at instead."""
    agent, ops, *_ = make_agent(tmp_path)
    R = agent.resolve("sglang.srt.model_executor.cpu_graph_runner").CPUGraphRunner
    runner = R()
    runner.padded_to_4 = lambda fb: _graph_batch(fb.req_pool_indices.tolist() + pad_rows,
                                                 fb.out_cache_loc.tolist() + pad_locs)
    raw = _graph_batch([7, 3, 5], [40, 41, 42])
    assert runner.prepare_replay(raw).batch_size == 4
    runner.prepare_replay(_graph_batch([7, 3, 5, 9], [40, 41, 42, 43]))  # not padded: nothing counted
    f = agent.facts.data
    assert f["graph_steps"] == 2 and f["graph_padded_steps"] == 1
    assert f.get("path_relay_entry0", 0) == on0
    if bad is None:
        assert not f.get("pad_rows_off_entry0") and not f.get("first_entry0_violation")
    else:
        assert f["pad_rows_off_entry0"] == 1 and bad in f["first_entry0_violation"], f


def test_a_request_holding_entry_0_is_a_violation(tmp_path):
    """The allocators keep req row 0 and KV slot 0 for padding: a request given either is reported,
    padded or not."""
    agent, *_ = make_agent(tmp_path)
    runner = agent.resolve("sglang.srt.model_executor.cpu_graph_runner").CPUGraphRunner()
    runner.prepare_replay(_graph_batch([7, 3, 5, 9], [40, 0, 42, 43]))
    assert agent.facts.data["pad_rows_off_entry0"] == 1
    assert "holds entry 0" in agent.facts.data["first_entry0_violation"]
