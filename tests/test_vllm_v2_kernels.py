"""The declared CPU adaptation of V2's sampling kernels (harness.agents.vllm.v2.kernels).

Our PyTorch stands in for vLLM's Gumbel sample, temperature, token logprobs and ranks kernels
under Triton's interpreter. Checked here: the murmur3 hash against a plain-Python one written from
the algorithm; the sample's own properties (greedy rows are the argmax, the noise follows the seed
and the position, a padded row is greedy, the caller's logits are left alone); and, for each set-up
release, agreement with vLLM's own kernels run in the interpreter on the same inputs.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from harness.agents.vllm.v2 import kernels

ROOT = Path(__file__).resolve().parent.parent
M = 0xFFFFFFFF


def _murmur3_words(words, seed=0):
    """murmur3_x86_32 over 32-bit words, one word at a time (the textbook loop)."""
    h = seed
    for k in words:
        k = (k * 0xCC9E2D51) & M
        k = ((k << 15) | (k >> 17)) & M
        k = (k * 0x1B873593) & M
        h ^= k
        h = ((h << 13) | (h >> 19)) & M
        h = (h * 5 + 0xE6546B64) & M
    h ^= 4 * len(words)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M
    return h ^ (h >> 16)


def test_the_hash_is_murmur3_of_seed_position_and_token():
    seeds = [0, 1, 12345, 2**32 + 7, 2**40 + 99, 2**62 + 3]
    pos = [0, 1, 17, 1000, 2**31 - 1, 5]
    keys = [0, 1, 2, 49151, 30000]
    got = kernels.hash32(torch.tensor(seeds)[:, None], torch.tensor(pos)[:, None], torch.tensor(keys)[None, :])
    for i, (s, p) in enumerate(zip(seeds, pos)):
        for j, k in enumerate(keys):
            assert int(got[i, j]) == _murmur3_words([s & M, (s >> 32) & M, p & M, k]), (s, p, k)


def _batch(n=6, vocab=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g) * 3
    idx = torch.tensor([0, 1, 2, 3, 5, -1][:n], dtype=torch.int32)
    temp = torch.tensor([0.0, 1.0, 0.7, 1.3, 0.0, 0.5, 1.0, 1.0])
    seeds = torch.tensor([1, 2**40 + 7, 3, 123456789, 5, 6, 7, 8])
    pos = torch.tensor([0, 5, 17, 1000, 3, 9][:n])
    return logits, idx, temp, seeds, pos


def test_the_gumbel_sample_follows_seed_and_position_and_leaves_the_logits():
    logits, idx, temp, seeds, pos = _batch()
    before = logits.clone()
    got = kernels.gumbel_argmax(logits, idx, temp, seeds, pos, True)
    assert torch.equal(logits, before)  # the sampler hands its processed logits on
    greedy = [0, 5]  # temperature 0, and a padded row (-1)
    assert got[greedy].tolist() == logits.argmax(-1)[greedy].tolist()
    assert torch.equal(got, kernels.gumbel_argmax(logits, idx, temp, seeds, pos, True))  # seeded: repeatable
    moved = kernels.gumbel_argmax(logits, idx, temp, seeds, pos + 1, True)
    other_seed = kernels.gumbel_argmax(logits, idx, temp, seeds + 1, pos, True)
    hot = [1, 2, 3]
    assert moved[greedy].tolist() == got[greedy].tolist()
    assert moved[hot].tolist() != got[hot].tolist()  # a position off by one draws other noise
    assert other_seed[hot].tolist() != got[hot].tolist()


def test_the_samples_follow_the_softmax():
    """Gumbel-max with our noise samples from softmax(logits): a 4-token row drawn at 4000 positions."""
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).repeat(4000, 1)
    idx = torch.zeros(4000, dtype=torch.int32)
    got = kernels.gumbel_argmax(logits, idx, torch.tensor([1.0]), torch.tensor([42]), torch.arange(4000), False)
    freq = torch.bincount(got, minlength=4).double() / 4000
    want = torch.softmax(logits[0].double(), -1)
    assert torch.allclose(freq, want, atol=0.03), (freq, want)


def _release_env(version: str):
    from harness.targets.vllm import releases as vllm_releases
    from harness.targets.vllm import setup as vllm_setup
    home = vllm_releases.home(version)
    why = vllm_setup.ready(home, version)
    if why:
        pytest.skip(why)
    stamp = json.loads((home / "setup.json").read_text())
    env = dict(os.environ, TRITON_INTERPRET="1", OVERLAP_HARNESS_HAS_TRITON="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "harness" / "agents" / "vllm" / "shims"), str(ROOT),
                                           stamp["overlay"]]))
    return stamp["python"], env


VS_VLLM = r"""
import json, torch
from vllm.v1.worker.gpu.sample import gumbel, logprob
from harness.agents.vllm.v2 import kernels
g = torch.Generator().manual_seed(7)
n, V = 8, 49152
logits = torch.randn(n, V, generator=g) * 3
idx = torch.tensor([0, 1, 2, 3, 4, 5, 6, -1], dtype=torch.int32)
temp = torch.tensor([0.0, 1.0, 0.7, 1.3, 0.9, 0.5, 2.0, 1.0])
seeds = torch.tensor([1, 2**40 + 7, 3, 123456789, 5, 6, 7, 8])
pos = torch.tensor([0, 5, 17, 1000, 3, 9, 64, 2])
out = {}
for at in (False, True):
    a = gumbel.gumbel_sample(logits.clone(), idx, temp, seeds, pos, apply_temperature=at, is_drafting=False)
    b = kernels.gumbel_argmax(logits, idx, temp, seeds, pos, at)
    out[f"sample{at}"] = [a.tolist(), b.tolist()]
l2, l3 = logits.clone(), logits.clone()
gumbel.apply_temperature(l2, idx, temp)
kernels.apply_temperature(None)(l3, idx, temp)
out["temperature"] = float((l2 - l3).abs().max())
ids = torch.randint(0, V, (n, 3), generator=g)
out["logprobs"] = float((logprob.compute_token_logprobs(logits, ids) - kernels.token_logprobs(None)(logits, ids)).abs().max())
r1, r2 = torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.int64)
logprob._ranks_kernel[(n,)](r1, logits, logits.stride(0), ids[:, 0].contiguous(), V, BLOCK_SIZE=8192)
kernels.ranks_kernel(None)[(n,)](r2, logits, logits.stride(0), ids[:, 0].contiguous(), V)
out["ranks"] = [r1.tolist(), r2.tolist()]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.vllm_source
@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_our_kernels_agree_with_vllms_in_the_interpreter(version):
    """vLLM's kernels in Triton's interpreter and ours on the same inputs: the samples agree (7 of
    8 rows at least: float rounding of the noise may flip a near-tie on another CPU), the
    temperature and logprobs to float32 rounding, the ranks exactly (counts of comparisons)."""
    python, env = _release_env(version)
    p = subprocess.run([python, "-c", VS_VLLM], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and line, p.stderr[-3000:]
    out = json.loads(line[0][7:])
    for at in (False, True):
        a, b = out[f"sample{at}"]
        assert sum(x == y for x, y in zip(a, b)) >= 7, (at, a, b)
    assert out["temperature"] < 1e-5 and out["logprobs"] < 1e-4, out
    assert out["ranks"][0] == out["ranks"][1]


def test_the_grammar_mask_bans_the_zero_bits_of_each_mapped_row(monkeypatch):
    """Bit v of a bitmask row allows token v; the row maps to (request, position) by
    mapping // MASK_STRIDE and mapping % MASK_STRIDE, and a position past the request's logits is
    skipped (written from the kernel's description, checked with a plain loop)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    vocab, stride = 70, 2
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, vocab, generator=g)
    cu = torch.tensor([0, 1, 3, 4], dtype=torch.int32)  # request 1 has two logits rows (a draft)
    mapping = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)  # req 0 pos 0/1, req 1 pos 0/1, req 2 pos 0
    bitmask = torch.randint(-2**31, 2**31 - 1, (5, 3), generator=g, dtype=torch.int64).to(torch.int32)
    want = logits.clone()
    for b, m in enumerate(mapping.tolist()):
        req, pos = divmod(m, stride)
        if pos >= int(cu[req + 1] - cu[req]):
            continue  # request 0 has one row: its position 1 is not written
        for v in range(vocab):
            if not (int(bitmask[b, v // 32]) >> (v % 32)) & 1:
                want[int(cu[req]) + pos, v] = float("-inf")
    launch = kernels.grammar_kernel(None)[(5, 1)]
    launch(logits, logits.stride(0), mapping, cu, bitmask, bitmask.stride(0), vocab, MASK_STRIDE=stride, BLOCK_SIZE=8192)
    assert torch.equal(logits, want)
    assert torch.isinf(want).any() and not torch.isinf(want).all()
