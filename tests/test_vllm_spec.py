"""Speculative decoding on vLLM (issue 43), without a server: the drafter's cut model directory,
the windows the agent counts and the oracle that compares them across the arms. The served runs
are tests/test_vllm_spec_served.py."""
import json
from types import SimpleNamespace

import numpy as np
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


def test_the_oracle_compares_windows_only_where_the_arms_gave_the_same_drafts():
    on = {"r1": ("k1", [(3, 3), (3, 1)]), "r2": ("k2", [(3, 2), (2, 2)]), "r3": ("k3", [(3, 0)])}
    off = {"x1": ("k1", [(3, 3), (3, 1)]), "x2": ("k2", [(3, 2), (3, 2)]), "x3": ("k3", [(3, 1)])}
    found, compared, parted = spec_steps.compare(on, off, ["k1", "k2", "k3"])
    assert (compared, parted) == (3, 1)  # k2's second window had 2 drafts on, 3 off: compared up to it
    assert len(found) == 1 and found[0].startswith("request k3: window 0 (3 drafts) accepted 0 async on, 1 off")
    assert spec_steps.compare(on, on, ["k1", "k2", "k3"]) == ([], 3, 0)
    # a wrong acceptance after matching windows is found although the rest of the schedule parts
    late = {"y": ("k1", [(3, 3), (3, 2), (1, 1)])}
    assert spec_steps.compare(late, off, ["k1"])[0][0].startswith("request k1: window 1 (3 drafts) accepted 2")
    # the steps oracle leaves out (for its step counts) the requests whose draft counts parted
    assert spec_steps.parted_keys(on, off) == {"k2"}
    assert spec_steps.summary(on) == {"windows": 5, "drafts": 14, "accepted": 8, "rate": 0.571, "mean_len": 2.6}


def test_a_drafter_s_configuration_sends_no_logit_bias_or_min_p():
    """vLLM answers 400 to either with drafts (measured: the first spec-draft gate's off arm died on mt1)."""
    from harness.targets.vllm import configs as vc
    body = {"prompt": [1], "logit_bias": {"5": 4.0}, "min_p": 0.1, "temperature": 0}
    assert vllm_spec.payload(vc.CONFIGS["spec-draft"], dict(body)) == {"prompt": [1], "temperature": 0}
    assert vllm_spec.payload(vc.CONFIGS["default"], dict(body)) == body
