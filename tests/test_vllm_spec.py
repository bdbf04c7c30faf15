"""Speculative decoding on vLLM (issue 43), without a server: the drafter's cut model directory,
the windows the agent counts and the oracle that compares them across the arms. The served runs
are tests/test_vllm_spec_served.py."""
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from harness.agents.vllm import spec as agent_spec
from harness.oracles import spec_steps
from harness.targets.vllm import spec as vllm_spec


def _model(d, layers=4):
    d.mkdir()
    t = {"model.embed_tokens.weight": np.ones((8, 4), np.float32), "model.norm.weight": np.ones(4, np.float32)}
    for i in range(layers):
        t[f"model.layers.{i}.mlp.up_proj.weight"] = np.full((4, 4), i, np.float32)
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": layers, "architectures": ["LlamaForCausalLM"]}))
    (d / "tokenizer.json").write_text("{}")
    return d


def test_the_cut_draft_keeps_the_first_layers_and_is_rewritten_only_when_its_source_changes(tmp_path):
    src = _model(tmp_path / "target")
    home = tmp_path / "home"
    [d] = vllm_spec.ensure_drafts(home, src)
    assert d == home / "models" / "smollm2-135m-draft-3l"
    t = load_file(str(d / "model.safetensors"))
    assert sorted(k for k in t if ".layers." in k) == [f"model.layers.{i}.mlp.up_proj.weight" for i in range(3)]
    assert json.loads((d / "config.json").read_text())["num_hidden_layers"] == 3
    assert (d / "tokenizer.json").is_file() and vllm_spec.draft_dir_current(d, src)
    before = (d / "model.safetensors").stat().st_mtime_ns
    vllm_spec.ensure_drafts(home, src)  # current: left alone
    assert (d / "model.safetensors").stat().st_mtime_ns == before
    _model(tmp_path / "other", layers=5)
    (src / "model.safetensors").write_bytes((tmp_path / "other" / "model.safetensors").read_bytes())
    assert not vllm_spec.draft_dir_current(d, src)  # other weights: the checksum says so, and it is cut again
    vllm_spec.ensure_drafts(home, src)
    assert len([k for k in load_file(str(d / "model.safetensors")) if ".layers." in k]) == 3
    assert vllm_spec.draft_dir_current(d, src)


def _step(drafts, sampled):
    rids = list(drafts)
    so = SimpleNamespace(scheduled_spec_decode_tokens=drafts,
                         num_invalid_spec_tokens={r: sum(1 for t in d if t == -2) for r, d in drafts.items()})
    mro = SimpleNamespace(sampled_token_ids=[sampled[r] for r in rids], req_id_to_index={r: i for i, r in enumerate(rids)})
    return so, mro


def test_the_agent_counts_each_window_from_the_scheduler_s_update():
    agent_spec._ACCEPTED.clear()
    reqs = {r: SimpleNamespace(prompt_token_ids=[1, 2, i], max_tokens=9) for i, r in enumerate("abc")}
    sched = SimpleNamespace(requests=reqs)
    # async, the scheduler's drafts are placeholders (-1); -2 marks here the ones a grammar invalidated
    so, mro = _step({"a": [-1, -1, -1], "b": [5, 6, 7], "c": [5, -2, -2]},
                    {"a": [5, 6, 7, 8], "b": [9], "c": [5, 3]})
    c = agent_spec._count(sched, so, mro)
    # a: all 3 accepted and the bonus token; b: none; c: 1 draft (2 invalidated by a grammar), accepted
    assert (c["spec_windows"], c["spec_drafts"], c["spec_accepted"]) == (3, 7, 4)
    assert (c["spec_full"], c["spec_rejected_all"], c["spec_rejections"]) == (2, 1, 1)
    assert [w for _, w in agent_spec._ACCEPTED.values()] == [[[3, 3]], [[3, 0]], [[1, 1]]]
    assert agent_spec._count(sched, *_step({}, {})) == {}  # a step without drafts: no count
    assert "spec_stale_windows" not in c
    reqs["b"].num_stale_output_tokens, reqs["b"].drop_stale_output = 4, True  # a reset's frame, returning stale
    reqs["a"].num_stale_output_tokens, reqs["a"].drop_stale_output = 4, False  # a KV-pressure one (delivered)
    c = agent_spec._count(sched, so, mro)
    assert (c["spec_stale_windows"], c["spec_stale_drop_rejections"], c["spec_stale_drop_resumed"]) == (2, 1, 0)
    reqs["b"].num_output_placeholders = 1  # b resumed whole in the schedule after the reset: its step's placeholder
    reqs["a"].num_output_placeholders = 1  # delivered mode: not the class's shape
    c = agent_spec._count(sched, so, mro)
    assert (c["spec_stale_drop_rejections"], c["spec_stale_drop_resumed"]) == (1, 1)


def test_windows_parted_between_the_arms_are_named_for_the_steps_oracle():
    """Draft counts (the token budget, the async placeholders) or accepted lengths (other drafts)
    parted: the request's steps may differ by design (harness.oracles.steps leaves their counts out)."""
    on = {"r1": ("k1", [(3, 3), (3, 1)]), "r2": ("k2", [(3, 2), (2, 2)]), "r3": ("k3", [(3, 0)])}
    off = {"x1": ("k1", [(3, 3), (3, 1)]), "x2": ("k2", [(3, 2), (3, 2)]), "x3": ("k3", [(3, 1)])}
    assert spec_steps.parted_keys(on, off) == {"k2", "k3"} and spec_steps.parted_keys(on, on) == set()
    assert spec_steps.parted_keys(on, {}) == {"k1", "k2", "k3"}  # on one arm only
    assert spec_steps.summary(on) == {"windows": 5, "drafts": 14, "accepted": 8, "rate": 0.571, "mean_len": 2.6}


def test_a_drafter_s_configuration_sends_no_logit_bias_or_min_p():
    """vLLM answers 400 to either with drafts (measured: the first spec-draft gate's off arm died on mt1)."""
    from harness.targets.vllm import configs as vc
    body = {"prompt": [1], "logit_bias": {"5": 4.0}, "min_p": 0.1, "temperature": 0}
    assert vllm_spec.payload(vc.CONFIGS["spec-draft"], dict(body)) == {"prompt": [1], "temperature": 0}
    assert vllm_spec.payload(vc.CONFIGS["default"], dict(body)) == body


def test_the_expand_workaround_writes_the_caller_s_buffer_at_its_dtype(monkeypatch):
    """FACT cpu_expand_drops_output (vllm#55005): vLLM's CPU shim fills a copy and leaves the
    caller's buffer unwritten (the stand-in below does the same); the agent's patch writes the
    expansion itself, counted, and leaves vLLM's shim alone under its stock switch."""
    import types

    import torch

    from harness.agents.vllm import state
    from harness.agents.vllm.workarounds import cpu_expand
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(state, "FACTS", {})
    calls = []

    def shim(output, input_val, cu, rf, rt, MAX_NUM_TOKENS=None):  # vLLM's: writes output.to(int64), a copy
        calls.append(output.dtype)
        output.to(torch.int64).fill_(7)

    temp, cu = torch.tensor([0.0, 0.7, 1.3]), torch.tensor([2, 3, 6], dtype=torch.int32)
    out = torch.full((6,), -5.0)
    cpu_expand.patch(shim)(out, temp, cu, 0, 1)
    assert torch.allclose(out, torch.tensor([1.0, 1.0, 0.7, 1.3, 1.3, 1.3])) and calls == []
    top_k = torch.full((6,), -5, dtype=torch.int32)
    cpu_expand.patch(shim)(top_k, torch.tensor([0, 5, 7], dtype=torch.int32), cu, 0, 0)
    assert top_k.tolist() == [0, 0, 5, 7, 7, 7]
    assert state.facts("worker").data["cpu_expand_fixes"] == 2
    i64 = torch.zeros(6, dtype=torch.int64)  # int64 both: vLLM's op writes the buffer itself
    cpu_expand.patch(shim)(i64, torch.tensor([1, 2, 3]), cu, 0, 0)
    assert calls == [torch.int64]
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={"stock": ["cpu_expand_dtype"]}))
    out = torch.full((6,), -5.0)
    cpu_expand.patch(shim)(out, temp, cu, 0, 1)
    assert out.tolist() == [-5.0] * 6  # vLLM's own shim: the buffer as it was


def test_placeholders_are_reads_only_in_rows_a_penalty_or_bad_words_read(monkeypatch):
    """vLLM lets the rows of requests without a penalty hold -1 (apply_all_penalties masks them);
    a -1 in a penalized row's output ids or appended drafts is a read (vllm#30122's class)."""
    import types

    import torch

    from harness.agents.vllm import state
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(state, "FACTS", {})
    sm = SimpleNamespace(no_penalties=False, bad_words_token_ids={2: [[9]]},
                         presence_penalties=torch.tensor([0.0, 0.5, 0.0, 0.0]),
                         frequency_penalties=torch.tensor([0.0, 0.0, 0.0, 0.0]),
                         repetition_penalties=torch.tensor([1.0, 1.0, 1.0, 1.0]),
                         output_token_ids=[[4, -1, -1], [4, 5], [6, -1], [7]], spec_token_ids=[[1], [-1, 2], [3], []])
    assert agent_spec.reading_rows(sm) == {1, 2}
    agent_spec._count_reads(sm, SimpleNamespace(num_draft_tokens=[1, 2, 1, 0]))
    f = state.facts("worker").data
    assert (f["spec_lp_steps"], f["spec_lp_placeholders"], f["spec_lp_unread_placeholders"]) == (1, 2, 2)
    assert [r["row"] for r in f["spec_lp_rows"]] == [1, 2]


def test_a_padded_draft_is_no_read_and_an_unrepaired_one_is(monkeypatch):
    """A -1 in a penalized row's drafts is padding when the rejection sampler verifies -1 there too
    (a request left out of the previous step: vLLM rejects the draft, and the positions that read it
    are discarded): counted apart, no violation. The same -1 where a real draft was verified (the
    drafts' repair missed it), and any -1 in the output ids (vllm#30122's class), are reads."""
    import types

    import torch

    from harness.agents.vllm import state
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(state, "FACTS", {})
    pen = torch.tensor([0.5, 0.5, 0.5, 0.0])
    sm = SimpleNamespace(no_penalties=False, bad_words_token_ids={}, presence_penalties=pen,
                         frequency_penalties=torch.zeros(4), repetition_penalties=torch.ones(4),
                         output_token_ids=[[4, 5], [4, 5], [4, -1, -1], [7, -1]],
                         spec_token_ids=[[-1, -1, -1], [8, -1, 9], [1, 2], [-1]])
    md = SimpleNamespace(num_draft_tokens=[3, 3, 2, 1],  # row 0 padded; row 1's second draft was real
                         draft_token_ids=torch.tensor([-1, -1, -1, 8, 6, 9, 1, 2, -1]))
    agent_spec._count_reads(sm, md)
    f = state.facts("worker").data
    assert f["spec_lp_padded_drafts"] == 3  # row 0's three
    assert f["spec_lp_placeholders"] == 3  # row 1's unrepaired draft, row 2's two output ids
    assert f["spec_lp_unread_placeholders"] == 2  # row 3: no penalty (its padded draft too)
    assert [(r["row"], r["verified"]) for r in f["spec_lp_rows"]] == [(1, [8, 6, 9]), (2, [1, 2])]
    # the stock quiet half: padding alone is no read
    monkeypatch.setattr(state, "FACTS", {})
    sm.output_token_ids, sm.spec_token_ids = [[4, 5]] * 4, [[-1, -1, -1], [8, 6, 9], [1, 2], [3]]
    agent_spec._count_reads(sm, md)
    f = state.facts("worker").data
    assert "spec_lp_placeholders" not in f and f["spec_lp_padded_drafts"] == 3


def test_a_sampled_request_is_left_uncompared_only_where_it_was_drafted_for_apart():
    """Its draws follow its windows (spec_steps.SAMPLED_APART): another draft count or other draft
    ids before its sampled ids part make it incomparable; ids that part under the same drafts are
    a real divergence; a greedy request is always compared."""
    from harness.agents.vllm.steps import request_key
    reqs = [SimpleNamespace(rid=f"s{i}", prompt_ids=[i], max_new_tokens=8, temperature=0.9) for i in range(3)]
    reqs.append(SimpleNamespace(rid="g0", prompt_ids=[9], max_new_tokens=8, temperature=None))
    k = {r.rid: request_key(r.prompt_ids, r.max_new_tokens) for r in reqs}
    on = {"a": (k["s0"], [([5, 6, 7], [5, 1]), ([1, 1, 1], [2])]),  # s0: drafts part in window 1
          "b": (k["s1"], [([5, 6, 7], [5, 2])]),  # s1: same drafts, other ids: compared
          "c": (k["s2"], [([5, 6], [3])]),  # s2: 2 drafts on, 3 off
          "d": (k["g0"], [([1, 2, 3], [4])])}
    off = {"x": (k["s0"], [([5, 6, 7], [5, 1]), ([1, 1, 2], [3])]), "y": (k["s1"], [([5, 6, 7], [5, 6, 9])]),
           "z": (k["s2"], [([5, 6, 8], [3])]), "w": (k["g0"], [([1, 2, 0], [4])])}
    assert spec_steps.sampled_apart(reqs, {True: on, False: off}) == {"s0", "s2"}
    assert spec_steps.sampled_apart(reqs, {}) == set()


def test_the_children_of_an_n_request_are_paired_by_their_index():
    """An n > 1 request's children share its key; vLLM names them `<index>_<parent id>` and the
    harness `#<index>`. Child 0 drafted [5] async on and [6] off (drafted apart: its draws follow
    its windows); paired by their windows' content instead, child 0 on would meet child 1 off
    (same drafts, other ids) and the request would be compared as if nothing had parted."""
    from harness.agents.vllm.steps import request_key
    r = SimpleNamespace(rid="n0", prompt_ids=[3], max_new_tokens=4, temperature=0.8)
    k = request_key(r.prompt_ids, r.max_new_tokens)
    on = {"0_cmpl-a": (k, [([5], [1])]), "1_cmpl-a": (k, [([6], [2])])}
    off = {"0_cmpl-b": (k, [([6], [1])]), "1_cmpl-b": (k, [([5], [2])])}
    assert spec_steps.sampled_apart([r], {True: on, False: off}) == {"n0"}
    same = {"0_cmpl-b": (k, [([5], [1])]), "1_cmpl-b": (k, [([6], [3])])}  # child 1: same drafts, other ids
    assert spec_steps.sampled_apart([r], {True: on, False: same}) == set()


def test_a_decode_step_without_drafts_is_a_window_and_parts_a_sampled_request(monkeypatch):
    """The stock spec-draft gate's s1 (seeded, 2026-12-07): async on, its token 1 came from a decode
    step without drafts (the token budget), async off from a window of three; both arms' next windows
    drafted [365, 216, 28], so aligned window by window the request looked drafted alike and its
    tokens were compared (a false divergence: the draws follow the windows). The worker records a
    later sample without drafts as a window with none (a decode step the budget left one position, a
    resumed request's recompute; not its first token), and the arms part there."""
    import types

    import torch

    from harness.agents.vllm import state
    from harness.agents.vllm.steps import request_key
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(state, "FACTS", {})
    monkeypatch.setattr(agent_spec, "_VERIFIED", type(agent_spec._VERIFIED)())
    batch = SimpleNamespace(req_ids=["a", "b", "c", "d"])
    reqs = {r: SimpleNamespace(prompt_token_ids=[1, 2, 3, 4, 5], sampling_params=SimpleNamespace(max_tokens=8),
                               output_token_ids=out) for r, out in zip("abcd", ([6, -1], [6, 7, -1], [], [6, 7]))}
    runner = SimpleNamespace(input_batch=batch, requests=reqs)
    md = SimpleNamespace(num_draft_tokens=[2, 0, 0, 0], draft_token_ids=torch.tensor([7, 8]))
    out = SimpleNamespace(sampled_token_ids=torch.tensor([[7, 3, -1], [4, -1, -1], [6, -1, -1], [5, -1, -1]]))
    agent_spec._record(runner, md, out)
    got = state.facts("spec_verify").data["verified"]
    # b: a decode step without drafts; c: its first token (no window); d: a resumed request's recompute
    assert got["a"][1] == [[[7, 8], [7, 3]]] and got["b"][1] == [[[], [4]]] and "c" not in got
    assert got["d"][1] == [[[], [5]]]
    r = SimpleNamespace(rid="s1", prompt_ids=[9], max_new_tokens=16, temperature=0.9)
    k = request_key(r.prompt_ids, r.max_new_tokens)
    on = {"x": (k, [([], [198]), ([365, 216, 28], [19])])}
    off = {"y": (k, [([365, 216, 28], [472]), ([360, 30, 365], [351])])}
    assert spec_steps.sampled_apart([r], {True: on, False: off}) == {"s1"}
    assert spec_steps.verify_findings(on, [k], "on") == ([], 2)  # no drafts: one token, the rule holds


def test_the_verify_rule_is_checked_window_by_window_on_greedy_requests():
    """Greedy: the sampled ids are the drafts' accepted prefix, then a token that is not the next
    draft (or the bonus after a whole window). A match rejected or a mismatch accepted is found on
    its arm; the arms' drafts are compared while their ids agree (reported)."""
    good = {"a": ("k1", [([5, 6, 7], [5, 6, 9]), ([1, 2, 3], [1, 2, 3, 4]), ([8, 8], [2])])}
    assert spec_steps.verify_findings(good, ["k1"], "on") == ([], 3)
    for bad in ([5, 6, 7], [5], [5, 6, 7, 1, 2]):  # a match rejected (the third; the first); too long
        f, _ = spec_steps.verify_findings({"a": ("k1", [([5, 6, 7], bad)])}, ["k1"], "on")
        assert len(f) == 1 and f[0].startswith("async on: request k1: window 0"), bad
    assert spec_steps.verify_findings({"a": ("k1", [([5], [6, 6])])}, ["k2"], "on") == ([], 0)  # not greedy
    other = {"b": ("k1", [([5, 6, 7], [5, 6, 9]), ([1, 2, 0], [1, 2, 3])])}
    assert spec_steps.drafts_apart(good, other, ["k1"]) == (2, 1)  # stops where the sampled ids part
    assert spec_steps.parted_keys({"a": ("k1", [(3, 1)])}, {"b": ("k1", [(3, 2)])}) == {"k1"}  # accepted parted


def test_stress_draws_a_drafter_and_its_k_as_the_configuration():
    """`stress --configs spec` draws "spec-<drafter>-k<k>" per segment from its seed; the name is the
    configuration a reproducer records, so replay (and shrinking, on the same pair) keep the drafter."""
    import pytest

    from harness.commands.stress_served import config_order
    from harness.targets.vllm import configs as vc
    a = SimpleNamespace(target="vllm", configs="spec", seed=3)
    names = config_order(a, ValueError)
    assert names == config_order(a, ValueError) and len(names) >= 2  # drawn from the seed
    for n in names:
        c = vc.resolve(n)
        assert c.spec[0] in vllm_spec.DRAFTERS and c.spec[1] in vc.SPEC_KS and c.name == n
        assert "logits-processors" in c.drop and set(vc.SPEC_HIDES) <= set(c.hides)
    assert {vc.get(n).spec for n in config_order(SimpleNamespace(target="vllm", configs="spec", seed=4),
                                                 ValueError)} != {vc.get(n).spec for n in names}
    assert vc.parse("spec-cut3-k2") == ["spec-cut3-k2"] and vc.get("spec-same-k1").spec == ("same", 1)
    for bad in ("spec-cut3-k9", "spec-nosuch-k2", "spec-cut3"):
        with pytest.raises(ValueError, match="unknown server configuration"):
            vc.parse(bad)


def test_the_ngram_drafter_is_v2_s_and_says_so_on_v1():
    """v2-ngram (and spec-ngram-k<k>) needs V2: --vllm-runner v1 is refused in one line, before any
    server starts; its speculative config is ngram_gpu's, with no draft model to look for."""
    from harness.targets.vllm import configs as vc
    from pathlib import Path
    c = vc.CONFIGS["v2-ngram"]
    assert c.runner == "v2" and c.spec == ("ngram", 3) and vc.drafted("spec-ngram-k2").runner == "v2"
    t = SimpleNamespace(config=c, runner="v1", home=Path("/nonexistent"), model_path="/nonexistent")
    assert "V2 model runner only" in vllm_spec.missing(t) and "--vllm-runner v2" in vllm_spec.missing(t)
    t.runner = "v2"
    assert vllm_spec.missing(t) == ""
    flag = json.loads(vllm_spec.args(t)[1])
    assert flag == {"method": "ngram_gpu", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    assert not any("vllm#55005" in a for a in vllm_spec.adaptations(t))  # V1's rejection sampler fixes: not V2's
    assert any("n-gram drafter" in a for a in vllm_spec.adaptations(t))
    import random
    rng = random.Random(1)
    assert not any("ngram" in vc.draw_drafted(rng, "v1") for _ in range(40))  # V1 draws the draft models only


@pytest.mark.parametrize("runner,want", [("v1", {"cut3", "same"}), ("v2", {"ngram"}),
                                         ("auto", {"cut3", "same", "ngram"})])
def test_stress_draws_the_drafters_the_runner_asked_runs(runner, want):
    """`stress --configs spec --vllm-runner R` draws the drafters R runs here (V2: the n-gram one,
    ngram_gpu; V1: the draft models; auto: each, on the runner its configuration names), with every
    k; each drawn name resolves to a configuration the runner asked can start (vllm_spec.missing
    says nothing), and it is the name the reproducer records: replay and shrinking keep the drafter."""
    import random

    from harness.commands.stress_served import config_order
    from harness.targets.vllm import configs as vc
    rng = random.Random(7)
    got = [vc.draw_drafted(rng, runner) for _ in range(200)]
    assert {vc.get(n).spec[0] for n in got} == want and {vc.get(n).spec[1] for n in got} == set(vc.SPEC_KS)
    for seed in range(6):
        for n in config_order(SimpleNamespace(target="vllm", configs="spec", seed=seed, vllm_runner=runner), ValueError):
            c = vc.resolve(n)
            assert c.spec[0] in want and c.name == n
            t = SimpleNamespace(config=c, runner=runner if runner != "auto" else (c.runner or "v1"),
                                home=Path(vllm_spec.__file__).parent, model_path=Path(vllm_spec.__file__).parent)
            if c.spec[0] == "ngram":  # no model: nothing to look for; the runner must be V2
                assert vllm_spec.missing(t) == "" and c.runner == "v2"
    # a seed that draws the n-gram drafter under V2 draws it on no seed under V1
    v2 = [config_order(SimpleNamespace(target="vllm", configs="spec", seed=s, vllm_runner="v2"), ValueError)
          for s in range(3)]
    assert all(n.startswith("spec-ngram-k") for names in v2 for n in names)
    assert not any("ngram" in n for s in range(6) for n in
                   config_order(SimpleNamespace(target="vllm", configs="spec", seed=s, vllm_runner="v1"), ValueError))


def test_placeholders_below_zero_are_counted_after_every_update():
    """The agent's check after each Scheduler.update_from_output (vllm#46066's class): a running
    request whose output placeholders went below 0 is counted with what it held; none is quiet; it
    runs on steps without drafts too (a stale frame's rollback is seen where vLLM's own assertion,
    at a token's delivery, may come too late to see it)."""
    ok = SimpleNamespace(request_id="a", num_output_placeholders=1, num_computed_tokens=9, num_tokens=9,
                         num_preemptions=0)
    bad = SimpleNamespace(request_id="b", num_output_placeholders=-2, num_computed_tokens=17, num_tokens=20,
                          num_preemptions=1)
    assert agent_spec._placeholders_below_zero(SimpleNamespace(running=[ok])) == {}
    got = agent_spec._placeholders_below_zero(SimpleNamespace(running=[ok, bad]))
    assert got["n"] == 1 and got["first"] == {"request": "b", "placeholders": -2, "num_computed_tokens": 17,
                                              "num_tokens": 20, "preemptions": 1}
    from harness.agents.vllm import state
    f = state.facts(agent_spec.ROLE)
    before = f.data.get("placeholders_below_zero", 0)
    sched = SimpleNamespace(running=[bad], requests={})
    agent_spec.update_from_output(lambda *a, **kw: "out")(sched, _step({}, {})[0], _step({}, {})[1])
    assert f.data["placeholders_below_zero"] == before + 1 and f.data["first_placeholders_below_zero"]["request"] == "b"
