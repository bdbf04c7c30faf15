"""V1 with pipeline parallelism on vLLM's CPU build (issue 45, item 4): the later stage's receive
buffer that the skipped warm-up never allocates (KNOWN_UPSTREAM cpu-v1-pp-eager-no-intermediate),
worked around by the agent where the release fact read from every cached wheel holds, so the pair
that judges `v1_pp_async_allowed` (vllm#45014) has its quiet arm. Fast: no engine runs (the served
runs: docs/results/2026-12-07-multi-worker-3.md)."""
from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from harness.agents.vllm import state
from harness.agents.vllm.workarounds import eager_warmup, pp_receive_buffer
from harness.targets.vllm import releases as vr
from harness.targets.vllm import upstream, workers

FACT = "cpu_v1_pp_eager_no_intermediate"


class _Runner:
    """A stand-in of V1's runner at a later stage: vLLM's own sync_and_gather asserts the buffer."""
    max_num_tokens = 8
    device = torch.device("cpu")
    model_config = types.SimpleNamespace(dtype=torch.float32)

    def __init__(self):
        self.intermediate_tensors = None
        self.made = []
        self.model = types.SimpleNamespace(make_empty_intermediate_tensors=self._make)

    def _make(self, batch_size, dtype, device):
        self.made.append((batch_size, dtype, device))
        return {"hidden_states": torch.zeros(batch_size, 4, dtype=dtype, device=device)}

    @staticmethod
    def sync_and_gather(self, num_tokens, intermediate_tensors, sync_self):
        assert self.intermediate_tensors is not None  # vLLM's line (gpu_model_runner.py)
        return {k: v[:num_tokens] for k, v in self.intermediate_tensors.items()}


def test_the_receive_buffer_is_made_once_as_the_warm_up_would_and_the_stock_switch_keeps_vllms_assert(monkeypatch):
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(state, "FACTS", {})
    gather = pp_receive_buffer.patch(_Runner.sync_and_gather)
    r = _Runner()
    assert gather(r, 3, None, False)["hidden_states"].shape == (3, 4)
    assert gather(r, 5, None, False)["hidden_states"].shape == (5, 4)  # the same buffer: made once
    assert r.made == [(8, torch.float32, torch.device("cpu"))]
    assert state.facts("worker").data["cpu_v1_pp_no_intermediate"] == 1
    warmed = _Runner()
    warmed.intermediate_tensors = {"hidden_states": torch.zeros(8, 4)}  # a warm-up ran (a GPU): vLLM's own
    gather(warmed, 2, None, False)
    assert warmed.made == [] and state.facts("worker").data["cpu_v1_pp_no_intermediate"] == 1
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={"stock": ["cpu_v1_pp_buffer"]}))
    with pytest.raises(AssertionError):
        gather(_Runner(), 3, None, False)
    assert state.facts("worker").data["cpu_v1_pp_no_intermediate"] == 2  # reached, counted, not worked around


def test_the_agents_own_warm_up_skip_keeps_the_warm_up_under_pipeline_parallelism(monkeypatch):
    """Before 0.27.0 the agent skips the eager warm-up itself (FACT cpu_warmup_under_eager): under PP
    that warm-up is what allocates the receive buffer, so it runs there."""
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(state, "FACTS", {})
    ran = []
    warm = eager_warmup.patch(lambda self: ran.append(self))
    for pp, runs in ((1, False), (2, True)):
        ran.clear()
        warm(types.SimpleNamespace(model_config=types.SimpleNamespace(enforce_eager=True),
                                   parallel_config=types.SimpleNamespace(pipeline_parallel_size=pp),
                                   vllm_config=types.SimpleNamespace(compilation_config=types.SimpleNamespace(mode=0))))
        assert bool(ran) == runs, pp


def test_the_entry_the_fact_and_the_adaptation_are_one_datum():
    """The known entry is live exactly where the fact read from every cached wheel holds
    (tests/test_vllm_releases.py checks the fact against each wheel's source); the verdict names the
    adaptation only for V1 with PP where it holds; its reproducers exist."""
    k = next(k for k in upstream.KNOWN_UPSTREAM if k.id == "cpu-v1-pp-eager-no-intermediate")
    s = vr.FACTS[FACT]
    assert (k.introduced, k.fixed) == (s.since, s.until) == ("0.27.0", "0.34.0") and FACT in vr.SOURCE_CHECKS
    assert k.counter == "cpu_v1_pp_no_intermediate" and k.codes == upstream.NEVER and k.runner == "v1"
    assert all(k.live_in(v) == vr.release(v).has(FACT) for v in vr.versions())
    root = Path(__file__).resolve().parents[1]
    assert (root / k.reproducer).is_file() and (root / k.reproducer).with_suffix(".py").is_file()
    from harness.targets.vllm import configs as vc

    def target(config, runner, version):
        return types.SimpleNamespace(config=vc.CONFIGS[config], runner=runner, release=vr.release(version))
    assert "receive buffer" in " ".join(workers.adaptations(target("pp2-v1", "v1", "0.32.0")))
    assert workers.adaptations(target("pp2", "v2", "0.32.0")) == []  # V2 allocates its own
    assert workers.adaptations(target("tp2", "v1", "0.32.0")) == []  # no later stage
    assert workers.adaptations(target("pp2-v1", "v1", "0.26.0")) == []  # the warm-up runs there
    new, seen, _ = upstream.classify("stress", [], counts={"cpu_v1_pp_no_intermediate": 1}, version="0.32.0", runner="v1")
    assert new == [] and [i for i, _ in seen] == ["cpu-v1-pp-eager-no-intermediate"]
