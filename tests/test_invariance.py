"""The start-up probe of batch invariance (harness/engine/invariance.py): it verifies the
engine's kernels on both matmul paths, at every row count up to 64, and attention, here and
under capped instruction sets (MKL, oneDNN and ATen held to AVX2, set before torch loads, so a
machine with wider vectors also runs what a narrower one would); it catches a matmul whose
result depends on the batch, and the suites then judge the ref engine by tie or race."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from harness.engine import invariance
from harness.engine.config import ModelConfig
from harness.engine.model import PLAIN_TILE, Model, pack_weight, init_tiny_weights

ROOT = Path(__file__).resolve().parents[1]
# SmolLM2's layer shapes (hidden 576, head_dim 64, 3 kv heads) with a smaller vocabulary: its
# weights are large enough for the oneDNN-packed path, the tiny model's take F.linear
SMOL_SHAPED = ModelConfig(name="smol-shaped", vocab_size=4096, hidden=576, layers=1, heads=9, kv_heads=3,
                          head_dim=64, intermediate=1536, max_context=256, tie_embeddings=True)
CAPS = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def models():
    from harness.engine.build import load_model
    cfg, w, _ = load_model("tiny")
    return {"tiny": Model(cfg, w, torch.device("cpu")),
            "smol-shaped": Model(SMOL_SHAPED, init_tiny_weights(SMOL_SHAPED, 0), torch.device("cpu"))}


def probe_all() -> dict:
    torch.set_num_threads(1)
    out = {}
    for name, m in models().items():
        packed = sorted({pack_weight(w) is not None for w in m.w.values() if w.dim() == 2})
        v = invariance.verify(m, use_cache=False)
        out[name] = {"line": v.line, "ok": v.ok, "paths": packed, "seconds": v.seconds}
    return out


def test_probe_verifies_both_matmul_paths_here():
    got = probe_all()
    assert got["tiny"]["paths"] == [False] and True in got["smol-shaped"]["paths"]  # both paths probed
    for name, r in got.items():
        assert r["ok"], f"{name}: {r['line']}"


@pytest.mark.skipif(sys.platform != "linux" or torch.backends.cpu.get_cpu_capability() == "DEFAULT",
                    reason="no vector instruction set to cap")
def test_probe_verifies_under_avx2_caps():
    """In a fresh process with the caps in its environment (they are read when torch loads)."""
    code = "import json; from tests.test_invariance import probe_all; print(json.dumps(probe_all()))"
    env = {**os.environ, **CAPS, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    for name, r in got.items():
        assert r["ok"], f"{name} under {CAPS}: {r['line']}"
    assert "AVX2" in got["tiny"]["line"]  # ATen's own kernels ran capped too


class SplitK(Model):
    """A batch-dependent matmul, as real kernels have: past one tile of rows the reduction over
    the inputs is split in two halves (split-K), so a row's rounding depends on the batch."""

    def linear(self, x, name, w=None):
        w = self.w[name] if w is None else w
        if x.shape[0] <= PLAIN_TILE:
            return F.linear(x, w)
        h = w.shape[1] // 2
        return F.linear(x[:, :h], w[:, :h]) + F.linear(x[:, h:], w[:, h:])


def test_a_batch_dependent_matmul_is_not_verified(monkeypatch, tmp_path):
    monkeypatch.setenv("OVERLAP_HARNESS_CACHE", str(tmp_path))
    from harness.engine.build import load_model
    cfg, w, _ = load_model("tiny")
    v = invariance.verify(SplitK(cfg, w, torch.device("cpu")))
    assert not v.ok and v.line.startswith("batch invariance: NOT verified: linear ")
    assert "differs from the row alone" in v.line
    assert not (tmp_path / invariance.CACHE_FILE).exists()  # a patched model is never cached
    # and the stock model is verified, then read from the cache
    stock = Model(cfg, w, torch.device("cpu"))
    invariance._MEMO.clear()
    first = invariance.verify(stock)
    invariance._MEMO.clear()
    again = invariance.verify(stock)
    assert first.ok and not first.cached and again.cached and again.line == first.line


def test_suites_judge_an_unverified_engine_by_tie_or_race(monkeypatch, tmp_path):
    """The ref target on the split-K model: the probe says NOT verified, the target is not
    batch-invariant, the absolute reference (exact only on an invariant engine) is off, and the
    equivalence oracle passes it: rounding is never called a race."""
    monkeypatch.setenv("OVERLAP_HARNESS_CACHE", str(tmp_path))
    import harness.engine.build as build
    from equivalence.test_overlap_equivalence import PRESETS, _check
    from harness.gate import invariance_lines
    from harness.oracles.reference import absolute_reference, batch_invariant
    from harness.targets.ref import RefTarget
    monkeypatch.setattr(build, "Model", SplitK)
    t = RefTarget()
    assert not t.invariance.ok and not batch_invariant(t)
    assert "NOT verified" in invariance_lines("ref") and "tie" in invariance_lines("ref")
    tok = t.tokenizer()
    make, kw = PRESETS["mixed"]
    reqs = make(tok, 0)
    assert absolute_reference(t, reqs, **kw) is None
    _check(t, tok, reqs, kw, "split-K")  # fails only on a clear winner
    # the split really moves bits: a batch of more than a tile against the first row alone
    m = SplitK(*build.load_model("tiny")[:2], torch.device("cpu"))
    x = torch.randn(PLAIN_TILE + 1, m.cfg.hidden, generator=torch.Generator().manual_seed(0))
    name = "model.layers.0.mlp.gate_proj.weight"
    assert not torch.equal(m.linear(x, name)[:1], m.linear(x[:1], name))
