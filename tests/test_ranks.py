"""Beyond one worker (issue 45): every rank's facts judged apart and named, counters not summed
across ranks, the steps the engine keeps in flight taken from the engine, and the split model.
Fast: no engine runs (the pair tests in tests/test_multi_worker_served.py run the real ones)."""
from __future__ import annotations

import numpy as np

from harness.agents.host_order import HostOrder
from harness.oracles import books as bookmod
from harness.oracles import steps
from harness.targets import split_model
from harness.targets.served import ranks
from harness.targets.vllm import workers

CLEAN = {"runner_requests": 0, "batch_rows": 0, "batch_slots": 0, "generators": 0, "host_buffers_held": 0}
ENGINE_BOOKS = {"blocks_total": 8, "blocks_free": 8, "blocks_in_use": 0, "requests": 0, "step": 5}


def _worker(pid, rank, tp=2, pp=1, books=None, **kw):
    return {"role": "worker", "pid": pid, "rank": rank, "tp_rank": rank % tp, "tp_size": tp,
            "pp_rank": rank // tp, "pp_size": pp, "use_async_scheduling": True, "books": books or dict(CLEAN),
            "books_steps": 5, **kw}


def _engine(**kw):
    return {"role": "engine", "pid": 10, "steps": 5, "books": dict(ENGINE_BOOKS), **kw}


def test_ranks_are_named_by_their_place_in_the_groups():
    assert ranks.label(_worker(1, 1)) == "rank 1 (tp 1 of 2)"
    assert ranks.label(_worker(1, 1, tp=1, pp=2)) == "rank 1 (pp stage 1 of 2)"
    assert ranks.label({"role": "worker"}) == "rank 0"  # one worker, an older agent: rank 0 of one
    # SGLang's schedulers say tp_rank / pp_rank only
    assert ranks.rank_of({"tp_rank": 1, "pp_rank": 1, "tp_size": 2}) == 3


def test_by_rank_keeps_one_file_a_rank_the_one_further_along():
    old, new = _worker(5, 1, books_steps=2), _worker(6, 1, books_steps=9)
    got = ranks.by_rank([new, _worker(4, 0), old, _engine()], "worker")
    assert list(got) == [0, 1] and got[1]["pid"] == 6


def test_a_counter_every_rank_counted_ran_once_the_engine_cores_are_summed():
    facts = [_worker(1, 0, penalty_steps=7), _worker(2, 1, penalty_steps=7), _engine(preemptions=3),
             {"role": "api", "pid": 3, "stop_string_stops": 2}]
    c = ranks.counts(facts)
    assert c["penalty_steps"] == 7, c  # not 14: TP=2 ran the path once
    assert c["preemptions"] == 3 and c["stop_string_stops"] == 2
    assert "rank" not in c and "tp_size" not in c  # a rank is no count
    # under PP only the last stage samples: its count is the count
    assert ranks.counts([_worker(1, 0, tp=1, pp=2), _worker(2, 1, tp=1, pp=2, penalty_steps=4)])["penalty_steps"] == 4
    # one worker: as before (the vLLM path table's counts)
    from harness.targets.vllm import paths as vp
    assert vp.counts([_worker(1, 0, tp=1, penalty_steps=2), _engine(preemptions=1)])["penalty_steps"] == 2


def test_one_ranks_leak_is_named_while_the_other_rank_is_clean():
    leaky = {**CLEAN, "batch_rows": 3, "runner_requests": 3}
    on = workers.books_of([_engine(), _worker(1, 0), _worker(2, 1, books=leaky)])
    off = workers.books_of([_engine(), _worker(3, 0), _worker(4, 1)])
    assert set(on["ranks"]) == {"rank 0 (tp 0 of 2)", "rank 1 (tp 1 of 2)"}
    got = bookmod.findings(on, off)
    assert got and all(f.startswith("async on: rank 1 (tp 1 of 2): ") for f in got), got
    assert any("3 input-batch rows still occupied at idle (the other arm: 0)" in f for f in got), got
    assert not any("rank 0" in f for f in got)
    assert bookmod.findings(off, off) == []
    assert "rank 1 (tp 1 of 2): 3 batch_rows" in bookmod.line(on, "on")
    # the same leak where the last file read was rank 0's (what the target kept before): still found
    on2 = workers.books_of([_engine(), _worker(2, 1, books=leaky), _worker(1, 0)])
    assert bookmod.findings(on2, off) == got


def test_a_rank_without_books_is_named_missing():
    w1 = _worker(2, 1)
    del w1["books"]  # rank 1 never wrote its books
    b = workers.books_of([_engine(), _worker(1, 0), w1])
    assert bookmod.missing(b) == ["rank 1 (tp 1 of 2): no worker books at idle"]


def test_one_worker_reads_as_before():
    b = workers.books_of([_engine(), _worker(1, 0, tp=1)])
    assert "ranks" not in b and b["worker"] == CLEAN
    assert bookmod.findings(b, b) == []
    leaky = workers.books_of([_engine(), _worker(1, 0, tp=1, books={**CLEAN, "generators": 1})])
    assert bookmod.findings(leaky, b) == ["async on: 1 seeded generators still in the batch at idle (the other arm: 0)"]


def test_every_ranks_setting_is_checked_and_named():
    facts = [_engine(), _worker(1, 0), _worker(2, 1, use_async_scheduling=False)]
    assert workers.setting_errors(facts, "v1", True) == [
        "rank 1 (tp 1 of 2): the worker runs use_async_scheduling=False"]
    assert workers.setting_errors(facts[:2], "v1", True) == []
    assert workers.setting_errors([_worker(1, 0, tp=1, runner="v2")], "v1", True) == [
        "the worker runs the V2 model runner"]


def test_one_rank_lost_is_lost_and_named():
    def judge(now, before):
        late = (now or {}).get("after_copy", 0)
        return (False, "late") if late else (True, "fine")
    facts = [_worker(1, 0, forward_copy={"after_copy": 0}), _worker(2, 1, forward_copy={"after_copy": 5})]
    eff, why = workers.overlap_line(workers.overlap_verdicts(facts, [], judge))
    assert eff is False and why == "rank 1 (tp 1 of 2): late"
    eff, why = workers.overlap_line(workers.overlap_verdicts(facts[:1], [], judge))
    assert (eff, why) == (True, "fine")  # one worker: its line as before, no rank


def test_the_overlap_is_judged_on_the_stage_that_samples_and_the_others_say_n_a():
    """PP: only the last stage samples and copies the ids (the others receive them), so the worker's
    overlap is judged there, named; a stage before it has no copy to overlap: one n/a line, never a
    verdict (before, its 'not judged' decided the line: judged on no rank)."""
    from harness.agents.host_order import judge_worker
    facts = [_worker(1, 0, tp=1, pp=2, forwards=[[1, 2]] * 9),
             _worker(2, 1, tp=1, pp=2, forward_copy={"judged": 9, "after_copy": 0})]
    v = dict(workers.overlap_verdicts(facts, [], judge_worker))
    assert v["rank 0 (pp stage 0 of 2)"][0] == workers.NA and "samples no ids" in v["rank 0 (pp stage 0 of 2)"][1]
    assert v["rank 1 (pp stage 1 of 2)"][0] is True
    eff, why = workers.overlap_line(list(v.items()))
    assert eff is True and "rank 1 (pp stage 1 of 2): worker: 0 of 9 forwards" in why, why
    assert "rank 0 (pp stage 0 of 2): n/a: " in why
    late = [facts[0], _worker(2, 1, tp=1, pp=2, forward_copy={"judged": 9, "after_copy": 9})]
    eff, why = workers.overlap_line(workers.overlap_verdicts(late, [], judge_worker))
    assert eff is False and why.startswith("rank 1 (pp stage 1 of 2): the worker began step N+1")
    assert [workers.samples(f) for f in (_worker(1, 0), _worker(2, 1), *facts)] == [True, True, False, True]


def test_overlap_judged_on_no_rank_while_the_run_has_steps_is_never_a_pass():
    """The sampling stage counted no forward with a copy in flight (the V2 runner's worker before
    issue 45's second round: the forward's clock was V1's only): not judged, and said for every
    rank; a run whose facts hold only stages that sample nothing says it was judged on no rank."""
    from harness.agents.host_order import judge_worker
    stage0 = _worker(1, 0, tp=1, pp=2, forwards=[[1, 2]] * 9)
    eff, why = workers.overlap_line(workers.overlap_verdicts([stage0, _worker(2, 1, tp=1, pp=2)], [], judge_worker))
    assert eff is None and "rank 1 (pp stage 1 of 2): worker: 0 forward(s) began" in why
    eff, why = workers.overlap_line(workers.overlap_verdicts([stage0], [], judge_worker))
    assert eff is None and why.startswith("worker: judged on no rank")


def test_the_v2_worker_counts_its_forwards_against_the_previous_copy(monkeypatch):
    """V2 (pp2's runner): from a step's copy start (AsyncOutput) to its model's next forward (the
    forward pre-hook), a wait of the worker's thread on that copy is a late forward: the same counts
    as V1's model_forward. A copy already landed at its watch, and a stage with no copy (PP, all but
    the last), count nothing."""
    import types

    import torch

    from harness.agents.vllm import state, timing
    from harness.agents.vllm.v2 import agent as v2agent
    from harness.agents.vllm.v2 import shared
    monkeypatch.setattr(state, "FACTS", {})
    monkeypatch.setattr(timing, "_FWD_COUNTS", {"judged": 0, "after_copy": 0})
    monkeypatch.setattr(timing, "LAST_COPY", [None])
    runner = types.SimpleNamespace(model=torch.nn.Linear(2, 2))
    v2agent._hook_forward(runner)
    v2agent._hook_forward(runner)  # once: a second call registers nothing more

    def step(copy_in_flight, blocks=False):
        if copy_in_flight is not None:  # the copy starts (V2's AsyncOutput, patched by the agent)
            shared.copy_started(types.SimpleNamespace(query=lambda: not copy_in_flight))
            shared.watch_copy()
        if blocks:
            timing.copy_wait_blocks()  # the worker's thread waits on the copy before its next forward
        runner.model(torch.zeros(1, 2))
    step(None)  # a stage that samples nothing: no copy
    step(False)  # the copy landed before its watch: nothing to judge
    step(True)
    step(True, blocks=True)
    assert state.facts("worker").data["forward_copy"] == {"judged": 2, "after_copy": 1}
    assert len(runner.model._forward_pre_hooks) == 1


def test_the_steps_in_flight_come_from_the_engine():
    assert steps.in_flight_of([_engine(batch_queue_size=3)]) == 3
    assert steps.in_flight_of([_engine()]) == 2  # no queue reported (SGLang): one step ahead


def _arm(**recs):
    return steps.summed({k: {"key": k, **v} for k, v in recs.items()})


class _R:
    def __init__(self, rid, key):
        self.rid, self.prompt_ids, self.max_new_tokens = rid, [], int(key.split(":")[1])


def test_k_steps_in_flight_give_k_minus_one_steps_of_slack_and_no_more():
    key = steps.request_key([], 8)
    reqs = [_R("a", key)]
    off = _arm(**{key: {"sampled": 4, "finish": "FINISHED_STOPPED", "admit_waits": 0}})
    on2 = _arm(**{key: {"sampled": 6, "finish": "FINISHED_STOPPED", "admit_waits": 2}})
    # one step in flight ahead (a queue of 2): 2 extra sampling steps and 2 admission waits are too many
    got = steps.compare(reqs, off, on2).findings
    assert [f.code for f in got] == ["steps.extra", "admission.starved"], got
    # PP=2 on V2 keeps 3: two steps ahead of the one waited on, so the same counts are within the slack
    assert steps.compare(reqs, off, on2, in_flight=3).findings == []
    on3 = _arm(**{key: {"sampled": 7, "finish": "FINISHED_STOPPED", "admit_waits": 3}})
    got = steps.compare(reqs, off, on3, in_flight=3).findings
    assert [f.code for f in got] == ["steps.extra", "admission.starved"], got
    assert "at most 2 more allowed" in got[0] and "2 steps more are allowed" in got[1]
    # a length-capped request: no slack at any k (the scheduler counts its placeholders against max_tokens)
    cap_off = _arm(**{key: {"sampled": 8, "finish": steps.LENGTH}})
    cap_on = _arm(**{key: {"sampled": 9, "finish": steps.LENGTH}})
    assert [f.code for f in steps.compare(reqs, cap_off, cap_on, in_flight=3).findings] == ["steps.past_cap"]


def test_the_host_order_counts_the_steps_in_flight():
    h = HostOrder()
    for n in range(3):
        h.scheduled({f"r{n}"}, 1, n)
    assert h.facts()["max_in_flight"] == 3
    h.wait_start(0)
    h.scheduled({"r3"}, 1, 4)
    assert h.facts()["max_in_flight"] == 3


def test_the_split_model_is_split_by_two_ranks_and_two_stages():
    cfg = {"num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 4, "hidden_size": 8,
           "num_hidden_layers": 30}
    assert "not divisible" in split_model.splits(cfg)  # SmolLM2-135M as it is
    t = {"model.embed_tokens.weight": np.zeros((10, 8), np.float32),
         "model.layers.0.self_attn.q_proj.weight": np.arange(36 * 8, dtype=np.float32).reshape(36, 8),
         "model.layers.0.self_attn.k_proj.weight": np.zeros((12, 8), np.float32),
         "model.layers.0.self_attn.v_proj.weight": np.zeros((12, 8), np.float32),
         "model.layers.0.self_attn.o_proj.weight": np.arange(8 * 36, dtype=np.float32).reshape(8, 36),
         "model.layers.29.mlp.up_proj.weight": np.zeros((4, 8), np.float32)}
    out, c = split_model.cut(t, cfg)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["num_hidden_layers"]) == (6, 2, split_model.LAYERS)
    assert split_model.splits(c) == ""
    assert out["model.layers.0.self_attn.q_proj.weight"].shape == (24, 8)  # query heads 0-5: KV heads 0-1's
    assert (out["model.layers.0.self_attn.q_proj.weight"] == t["model.layers.0.self_attn.q_proj.weight"][:24]).all()
    assert out["model.layers.0.self_attn.k_proj.weight"].shape == (8, 8)
    assert out["model.layers.0.self_attn.o_proj.weight"].shape == (8, 24)
    assert "model.layers.29.mlp.up_proj.weight" not in out


def test_sglang_books_are_judged_per_rank():
    from harness.targets.sglang.target import SglangTarget
    per = {"rank 0 (tp 0 of 2)": {"req_rows_held": 0, "req_rows_total": 8, "pool_leaks": 0, "first_leak": ""},
           "rank 1 (tp 1 of 2)": {"req_rows_held": 2, "req_rows_total": 8, "pool_leaks": 1, "first_leak": "x"}}
    books = {"engine": {"req_rows_held": 2, "req_rows_total": 16, "pool_leaks": 1}, "ranks": per,
             "first_leak": "rank 1 (tp 1 of 2): x"}
    line = SglangTarget.books_line(None, books, "on")
    assert "NOT BACK (rank 1 (tp 1 of 2)): rank 1 (tp 1 of 2): x" in line, line
    assert "rank 0 (tp 0 of 2): req_to_token rows 8 free of 8" in line


def test_a_decode_the_pipeline_holds_back_is_no_wait():
    from types import SimpleNamespace as NS

    from harness.agents.vllm.steps import could_continue

    def req(**kw):
        base = dict(num_tokens_with_spec=5, num_output_placeholders=0, num_computed_tokens=4, next_decode_eligible_step=0)
        return NS(**{**base, **kw})
    sched = NS(current_step=7)
    assert could_continue(sched, req())  # one token to compute, eligible: left out with budget free is a wait
    assert not could_continue(sched, req(next_decode_eligible_step=8))  # V2+PP+async: the decode stagger
    assert not could_continue(sched, req(num_computed_tokens=5))  # sync PP: its token is still in flight
    assert could_continue(sched, req(num_computed_tokens=5, num_output_placeholders=1))  # async: a placeholder
    assert could_continue(NS(), NS())  # a release without these counts: judged as before


def test_the_multi_worker_configurations_are_named_only():
    from harness.targets.vllm import configs as vc
    assert not {"tp2", "pp2", "pp2-v1", "pp3-v1"} & set(vc.parse("all"))  # heavy: never drawn by default
    assert vc.parse("tp2,pp2") == ["tp2", "pp2"]
    assert (vc.CONFIGS["tp2"].model, vc.CONFIGS["pp2"].runner) == ("split", "v2")
    import pytest
    with pytest.raises(RuntimeError, match="refuses pipeline parallelism with async scheduling on the V1"):
        vc.resolve("pp2-v1")  # vLLM's own refusal, one line
    assert vc.resolve("pp2-v1", faults={"v1_pp_async_allowed"}).name == "pp2-v1"  # lifted by its patch only
    from harness.targets.sglang import spec as sglang_spec
    every = sglang_spec.parse("all", ValueError)
    assert "tp2" not in every and every and all(sglang_spec.CONFIGS[n].drafter for n in every)  # the drafters
    assert sglang_spec.parse("tp2", ValueError) == ["tp2"]
    assert "tp2" not in sglang_spec.stress_order("all", ValueError) and sglang_spec.stress_order("tp2", ValueError) == ["tp2"]


def test_each_multi_worker_patch_names_its_configuration():
    from harness.agents.vllm.multi_patches import CONFIG
    from harness.agents.vllm.patches import PATCHES
    from harness.targets.vllm import configs as vc
    for name, cfg in CONFIG.items():
        assert PATCHES[name].config == cfg and cfg in vc.CONFIGS, name
        assert PATCHES[name].upstream, name


def test_a_patch_no_configuration_reaches_is_listed_with_its_reason_and_not_run(monkeypatch, capsys):
    """The kill matrix lists it with the reason read from the release's code (never counted missed
    or caught); `faults` prints it; one that is reachable runs (its configuration's command)."""
    from harness.cli import main
    from harness.gate import matrix
    from dataclasses import replace

    from harness.agents.vllm import patches
    ran = []
    monkeypatch.setattr(matrix, "run_suites", lambda *a, **k: ran.append(a[1]) or
                        type("R", (), {"interrupted": False, "suites": {}})())
    # none of 0.32.0's patches is unreachable now (issue 45 found pp3-v1 and spec-draft): one made so
    monkeypatch.setitem(patches.PATCHES, "rank_keeps_finished_state", replace(
        patches.PATCHES["rank_keeps_finished_state"], unreachable="not reachable on vLLM 0.32.0: a test's reason"))
    m = matrix.kill_matrix(faults=["preempt_stales_one_frame", "v1_pp_async_allowed", "pp_decode_no_stagger",
                                   "rank_keeps_finished_state"], target="vllm")
    assert m["not_here"]["rank_keeps_finished_state"] == "not reachable on vLLM 0.32.0: a test's reason"
    assert ran == [()]
    # vllm#48245's miscount is judged on the stock configuration with a request's tokens in flight at a
    # preemption (a speculative frame); its two-frame form has no quiet arm (multi_patches.TWO_FRAMES)
    assert m["not_here"]["preempt_stales_one_frame"].startswith("needs the spec-draft configuration")
    # reachable on CPU (pp3-v1 runs it): listed with the command of its configuration, not a reason
    assert m["not_here"]["v1_pp_async_allowed"].startswith("needs the pp3-v1 configuration")
    assert m["not_here"]["pp_decode_no_stagger"].startswith("needs the pp2 configuration")
    assert main(["faults", "--target", "vllm"]) == 0
    assert "not reachable on vLLM 0.32.0: a test's reason" in capsys.readouterr().out


def test_sglang_idle_books_read_every_ranks_scheduler(tmp_path):
    """SglangTarget.idle_books waits for every rank's own idle check and keeps each rank's counts."""
    import json
    import threading
    from types import SimpleNamespace as NS

    from harness.targets.sglang.target import SglangTarget

    def write(checks, held1):
        for r in (0, 1):
            f = {"role": "sglang-scheduler", "pid": 100 + r, "tp_rank": r, "tp_size": 2, "pp_rank": 0, "pp_size": 1,
                 "steps": 9, "books_idle_checks": checks, "pool_leaks": int(r == 1 and held1 > 0),
                 "first_leak": "req_to_token row 3" if r == 1 and held1 else "",
                 "books": {"req_rows_total": 8, "req_rows_free": 8 - (held1 if r == 1 else 0)}}
            (tmp_path / f"sglang-scheduler-{100 + r}.json").write_text(json.dumps(f))
    write(1, 0)
    me = NS(facts_dir=lambda overlap: tmp_path)
    threading.Timer(0.3, write, (2, 2)).start()  # both ranks idle again, rank 1 holding two rows
    got = SglangTarget.idle_books(me, True, wait_s=5.0)
    assert got["engine"] == {"req_rows_held": 2, "req_rows_total": 16, "pool_leaks": 1}
    assert got["ranks"]["rank 1 (tp 1 of 2)"]["req_rows_held"] == 2 and got["first_leak"].startswith("rank 1")
    assert got["ranks"]["rank 0 (tp 0 of 2)"]["req_rows_held"] == 0
    assert "NOT BACK (rank 1 (tp 1 of 2))" in SglangTarget.books_line(None, got, "on")
