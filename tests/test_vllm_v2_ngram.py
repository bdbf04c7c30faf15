"""The declared CPU adaptation of V2's n-gram drafter (harness.agents.vllm.v2.ngram).

Our PyTorch stands in for `_ngram_scan_kernel` and `_ngram_finalize_kernel` under Triton's
interpreter. Checked here: both against a plain-Python reading of what the kernels compute (the
longest suffix n-gram seen before, rightmost on a tie; the K tokens after it, the last sampled
token where there are none), on small batches of repetitive token rows; the scratch row against
vLLM's own scan run in the interpreter (the finalize cannot run there: that is why it is ours).
"""
from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest
import torch

from harness.agents.vllm.v2 import kernels, ngram

ROOT = Path(__file__).resolve().parent.parent


def _best(row: list[int], seq: int, min_n: int, max_n: int, lo: int, hi: int):
    """The longest n (then the rightmost start p in [lo, hi)) whose n tokens at p equal the row's
    last n tokens, with the match ending before the last token (p + n <= seq - 1); None if none."""
    best = None
    for n in range(min_n, max_n + 1):
        if n > seq:
            break
        suffix = row[seq - n:seq]
        for p in range(max(lo, 0), min(hi, seq - n)):
            if row[p:p + n] == suffix:
                best = max(best or (0, -1), (n, p))
    return best


def _score(b, L):
    return 0 if b is None else b[0] * (L + 1) + b[1] + 1


def _case(rng: random.Random, rows=5, reqs=7, L=40, vocab=4):
    tokens = torch.zeros((reqs, L), dtype=torch.int32)
    total = torch.zeros(reqs, dtype=torch.int32)
    for r in range(reqs):
        n = rng.randint(0, L)
        tokens[r, :n] = torch.tensor([rng.randrange(vocab) for _ in range(n)], dtype=torch.int32)
        tokens[r, n:] = rng.randrange(1000, 2000)  # what lies past the known tokens must never be drafted
        total[r] = n
    idx = torch.tensor(rng.sample(range(reqs), rows), dtype=torch.int64)
    num_sampled = torch.tensor([rng.choice([0, 1, 1, 2]) for _ in range(rows)], dtype=torch.int32)
    last = torch.tensor([[rng.randrange(500, 600)] for _ in range(reqs)], dtype=torch.int64)
    return tokens, total, idx, num_sampled, last


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("min_n,max_n,k,block_l", [(1, 3, 3, 16), (2, 2, 4, 8), (1, 5, 2, 64)])
def test_the_drafts_follow_the_longest_rightmost_suffix_match(seed, min_n, max_n, k, block_l, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rng = random.Random(seed * 100 + min_n * 10 + max_n)
    L = 40
    tokens, total, idx, num_sampled, last = _case(rng, L=L)
    rows, blocks = len(idx), -(-L // block_l)
    scratch = torch.full((8, blocks + 1), -7, dtype=torch.int64)  # a wider buffer: only [rows, blocks] written
    drafts = torch.full((8, k), -7, dtype=torch.int64)
    ngram._ScanLaunch(None)[(rows, blocks)](tokens, tokens.stride(0), idx, total, num_sampled, scratch,
                                            scratch.stride(0), L, min_n, max_n, 8, block_l, num_warps=4, num_stages=2)
    ngram._FinalizeLaunch(None)[(rows,)](tokens, tokens.stride(0), idx, total, num_sampled, last.view(-1), scratch,
                                         scratch.stride(0), drafts, L, blocks, k, 4, 8, num_warps=2, num_stages=1)
    matched = 0
    for b in range(rows):
        r, seq = int(idx[b]), int(total[idx[b]])
        row = tokens[r].tolist()
        sampled = int(num_sampled[b]) > 0
        for blk in range(blocks):
            want = _score(_best(row, seq, min_n, max_n, blk * block_l, (blk + 1) * block_l), L) if sampled else 0
            assert int(scratch[b, blk]) == want, (b, blk)
        assert (scratch[b, blocks] == -7) and (scratch[rows:] == -7).all()
        best = _best(row, seq, min_n, max_n, 0, L) if sampled else None
        lt = int(last[r, 0])
        want = [lt] * k
        if best is not None:
            matched += 1
            after = row[best[1] + best[0]:seq]
            want = [after[i] if i < len(after) else lt for i in range(k)]
        assert drafts[b].tolist() == want, (b, row[:seq], best)
    assert (drafts[rows:] == -7).all()
    assert matched  # a vocabulary of 4 repeats: some rows match


def test_outside_the_interpreter_vllms_kernel_runs(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    called = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *a, **kw: called.append((grid, len(a), kw))

    t = torch.zeros((2, 8), dtype=torch.int32)
    ngram._ScanLaunch(Kernel())[(1, 1)](t, 8, torch.zeros(1, dtype=torch.int64), torch.zeros(2, dtype=torch.int32),
                                        torch.ones(1, dtype=torch.int32), torch.zeros((1, 1), dtype=torch.int64), 1, 8,
                                        1, 2, 2, 16, num_warps=4, num_stages=2)
    assert called == [((1, 1), 12, {"num_warps": 4, "num_stages": 2})]


VS_VLLM = r"""
import json, random, torch
from vllm.v1.worker.gpu.spec_decode.ngram import speculator as S
from harness.agents.vllm.v2 import kernels, ngram
out = []
for seed in range(4):
    rng = random.Random(seed)
    L, reqs, rows, block_l, min_n, max_n = 96, 6, 5, 32, 1 + seed % 2, 3 + seed % 2
    tok = torch.randint(0, 3, (reqs, L), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)
    total = torch.tensor([rng.randint(0, L) for _ in range(reqs)], dtype=torch.int32)
    idx = torch.tensor(rng.sample(range(reqs), rows), dtype=torch.int64)
    ns = torch.tensor([rng.choice([0, 1, 3]) for _ in range(rows)], dtype=torch.int32)
    nb = -(-L // block_l)
    a, b = torch.zeros((reqs, nb), dtype=torch.int64), torch.zeros((reqs, nb), dtype=torch.int64)
    po2 = 1 << (max_n - 1).bit_length()
    S._ngram_scan_kernel[(rows, nb)](tok, tok.stride(0), idx, total, ns, a, a.stride(0), L, min_n, max_n, po2, block_l)
    ngram._ScanLaunch(None)[(rows, nb)](tok, tok.stride(0), idx, total, ns, b, b.stride(0), L, min_n, max_n, po2, block_l)
    out.append([a.tolist(), b.tolist()])
print("RESULT " + json.dumps(out))
"""


@pytest.mark.vllm_source

def _in_the_interpreter(script: str):
    """Run `script` in the pinned vLLM's venv under Triton's interpreter (our shims first on the path);
    the JSON it prints after "RESULT "."""
    from harness.targets.vllm import setup as vllm_setup
    home = vllm_setup.vllm_home()
    python = home / "venv" / "bin" / "python"
    if vllm_setup.ready(home) or not python.exists():
        pytest.skip(f"no vLLM setup in {home}: run `overlap-harness setup vllm`")
    env = dict(os.environ, TRITON_INTERPRET="1", OVERLAP_HARNESS_HAS_TRITON="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "harness" / "agents" / "vllm" / "shims"), str(ROOT)]))
    p = subprocess.run([str(python), "-c", script], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and line, p.stderr[-3000:]
    return json.loads(line[0][7:])

@pytest.mark.slow
@pytest.mark.scheduled
def test_our_scan_writes_the_scratch_vllms_writes_in_the_interpreter():
    """vLLM 0.32.0's `_ngram_scan_kernel` run in Triton's interpreter and ours on the same batches
    (small vocabulary: many matches, of every length): the scratch rows are equal, exactly.
    Scheduled (vLLM's import and the interpreter: 10-17 s here); .ci/run's representative is
    test_the_drafts_follow_the_longest_rightmost_suffix_match (both kernels against a plain-Python
    reading, no vLLM)."""
    cases = _in_the_interpreter(VS_VLLM)
    for theirs, ours in cases:
        assert theirs == ours
    assert any(v > 0 for theirs, _ in cases for row in theirs for v in row)


def _resample(logits, cu, step, exp_idx, drafts, temp, seeds, pos, block=8):
    rows, V = len(cu) - 1, logits.shape[1]
    blocks = -(-V // block)
    am = torch.full((rows, blocks), -5, dtype=torch.int64)
    mx = torch.full((rows, blocks), 7.0)
    kernels.resample(am, am.stride(0), mx, mx.stride(0), logits, logits.stride(0), step, cu, exp_idx, drafts, temp,
                     seeds, pos, V, block, rows, blocks)
    return am, mx


def test_the_resample_draws_the_bonus_or_the_correction_without_the_rejected_draft(monkeypatch):
    """V2's rejection sampler's resample (harness.agents.vllm.v2.kernels.resample): per request, the
    token after its accepted drafts; the kernel's per-block (max, token) written for it."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    V = 20
    logits = torch.full((6, V), -10.0)
    logits[:, 3], logits[:, 11] = 5.0, 4.0  # every row's top token is 3, then 11
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    exp_idx = torch.tensor([1, 1, 1, 0, 0, 0], dtype=torch.int32)  # request 0 -> state 1, request 1 -> state 0
    drafts = torch.tensor([9, 3, 3, 9, 3, 3])
    seeds, pos = torch.tensor([11, 12]), torch.arange(6)
    # greedy request 0 rejected at its step 1: no draw (the verify wrote the argmax), untouched
    am, mx = _resample(logits, cu, torch.tensor([1, 2]), exp_idx, drafts, torch.tensor([0.0, 0.0]), seeds, pos)
    assert (am[0] == -5).all() and (mx[0] == 7.0).all()
    # greedy request 1 at its last row: the bonus token, the row's argmax, written per block
    assert int(am[1][mx[1].argmax()]) == 3 and am[1].tolist() == [3, 11, 16]
    # sampled (temperature 1), rejected at step 1: the draft there (3) can never be drawn
    temp = torch.tensor([1.0, 1.0])
    got = set()
    for s in range(40):
        am, mx = _resample(logits, cu, torch.tensor([1, 0]), exp_idx, drafts, temp, torch.tensor([s, s]), pos)
        got.add(int(am[0][mx[0].argmax()]))
        again, _ = _resample(logits, cu, torch.tensor([1, 0]), exp_idx, drafts, temp, torch.tensor([s, s]), pos)
        assert torch.equal(am, again)  # the seed and the position decide the draw
    assert 3 not in got and 11 in got


VS_RESAMPLE = r"""
import json, torch
from vllm.v1.worker.gpu.spec_decode import rejection_sampler_utils as U
from harness.agents.vllm.v2 import kernels
g = torch.Generator().manual_seed(3)
V, K, R = 49152, 3, 6
nl = R * (K + 1)
cu = torch.arange(0, nl + 1, K + 1, dtype=torch.int32)
logits = torch.randn(nl, V, generator=g) * 3
idx = torch.arange(R, dtype=torch.int32)
exp_idx = idx.repeat_interleave(K + 1)
local = torch.arange(K + 1, dtype=torch.int32).repeat(R)
am = logits.argmax(-1)
draft = torch.randint(0, V, (nl,), generator=g)
draft[1], draft[2] = am[0], am[1]   # request 0 accepts two
draft[5:8] = am[4:7]                # request 1 accepts all three: the bonus token
pos = torch.arange(nl, dtype=torch.int64) + 10
temp = torch.tensor([0.0, 0.0, 0.8, 1.0, 0.7, 1.3])
seed = torch.arange(R, dtype=torch.int64) + 100
out = {}
for ours in (False, True):
    if ours:
        U._resample_kernel = kernels._ResampleLaunch(U._resample_kernel)
    s, n = U.rejection_sample(logits.clone(), None, draft, cu, pos, idx, exp_idx, local, temp, seed, K)
    out[str(ours)] = [s.tolist(), n.tolist()]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.vllm_source
@pytest.mark.slow
@pytest.mark.scheduled
def test_our_resample_draws_what_vllms_draws_in_the_interpreter():
    """vLLM 0.32.0's rejection_sample in Triton's interpreter, with its resample kernel and with
    ours: the accepted counts equal, the greedy requests' tokens equal, the seeded ones 3 of 4 at
    least (float rounding of the noise may flip a near-tie on another CPU, as for the Gumbel sample).
    Scheduled (vLLM's import and the interpreter); .ci/run's representative is
    test_the_resample_draws_the_bonus_or_the_correction_without_the_rejected_draft."""
    out = _in_the_interpreter(VS_RESAMPLE)
    (theirs, n1), (ours, n2) = out["False"], out["True"]
    assert n1 == n2 and n1[:2] == [3, 4], (n1, n2)
    last = [row[n - 1] for row, n in zip(theirs, n1)], [row[n - 1] for row, n in zip(ours, n2)]
    assert last[0][:2] == last[1][:2]  # greedy: the correction and the bonus token
    assert sum(a == b for a, b in zip(last[0][2:], last[1][2:])) >= 3, last
