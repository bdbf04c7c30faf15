"""The arithmetic fixture: checksum, generator determinism and splits, accuracy through the engine."""
from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fixtures.arith import evaluate as E  # noqa: E402
from fixtures.arith import problems as P  # noqa: E402
from fixtures.arith.loader import HERE, ChecksumError, load_arith, verify  # noqa: E402


needs_weights = pytest.mark.skipif(
    not (HERE / "model.safetensors").exists(),
    reason="fixtures/arith/model.safetensors is not trained yet (python -m fixtures.arith.train)")


@needs_weights
def test_checksum_verifies():
    verify()
    cfg, w = load_arith("cpu")
    assert cfg.vocab_size == 259 and not cfg.tie_embeddings and "lm_head.weight" in w
    assert (HERE / "model.safetensors").stat().st_size <= 10 * 1024 * 1024


@needs_weights
def test_checksum_mismatch_is_reported(tmp_path):
    for name in ("model.safetensors", "config.json", "SHA256SUMS"):
        shutil.copy(HERE / name, tmp_path / name)
    data = bytearray((tmp_path / "model.safetensors").read_bytes())
    data[-1] ^= 0x01
    (tmp_path / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="checksum mismatch"):
        load_arith("cpu", tmp_path)


def test_generator_is_deterministic_and_gsm8k_shaped():
    a, b = P.generate(200, 7), P.generate(200, 7)
    assert a == b
    assert a != P.generate(200, 8)
    for p in a:
        assert set(p) == {"question", "answer"}
        n = int(p["answer"].split("#### ")[-1])
        assert p["answer"].endswith(f"\n#### {n}") and 0 <= n < 100
        assert 1 <= p["answer"].count(" = ") <= 2  # at most two steps
    t1, t2 = P.TrainStream(P.TRAIN_SEED_BASE, exclude=set()), P.TrainStream(P.TRAIN_SEED_BASE, exclude=set())
    assert [next(t1) for _ in range(50)] == [next(t2) for _ in range(50)]


def test_heldout_disjoint_from_training():
    held = P.heldout_questions()
    assert {p["question"] for p in P.heldout(300)} <= held
    stream = P.TrainStream(P.TRAIN_SEED_BASE)
    train = [next(stream) for _ in range(20000)]
    assert not held & {p["question"] for p in train}
    assert stream.n_dropped > 0  # the templates do collide, so the filter is doing work
    val = {p["question"] for p in P.validation(100)}
    assert val <= held and not val & {p["question"] for p in P.heldout(300)}


def test_jsonl_roundtrip(tmp_path):
    probs = P.heldout(20)
    P.write_jsonl(tmp_path / "h.jsonl", probs)
    assert P.read_jsonl(tmp_path / "h.jsonl") == probs


@needs_weights
def test_accuracy_through_engine():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # fastest for this small model, and on a shared machine
    t = time.time()
    cfg, w = load_arith("cpu")
    probs = P.heldout(64)
    outs = E.generate(probs, cfg, w, overlap=True, max_running=64)
    elapsed = time.time() - t
    torch.set_num_threads(threads)
    s = E.score(probs, outs)
    assert s["strict"] >= 0.85, (s, [o for o in outs[:4]])
    assert elapsed < 60


def test_the_served_model_directory_is_stamped_with_the_shipped_checksum():
    """`setup vllm` / `setup sglang` stamp the arith model directory they write with the fixture's
    checksum (to rebuild it when the fixture changes): the stamp is the line SHA256SUMS ships.
    (A refactor once left this call pointing at a helper that was gone: the cold setup died.)"""
    from harness.targets.hf_export import fixture_sha256
    sums = dict(reversed(line.split()) for line in (HERE / "SHA256SUMS").read_text().splitlines())
    assert fixture_sha256() == sums["model.safetensors"]
