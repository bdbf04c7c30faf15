"""A declared CPU adaptation: PyTorch for V2's sampling kernels under Triton's interpreter.

On a CPU, V2's Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1), which executes
each program of a launch in Python, block by block: a Gumbel sample over SmolLM2's 49152-entry
vocabulary is 48 programs a row, each hashing its noise in interpreted numpy. Measured with
benchmarks/bench_vllm_v2.py --profile, those kernels (the Gumbel sample, the logprobs' log-softmax
and ranks) were most of a V2 step, and V2 ran 20x slower than V1 on the same workload.

What is replaced, only on CPU tensors under the interpreter (both servers of a pair alike), is
kernels whose job is not the overlap: they read this step's logits and write this step's result,
and hold no state across steps. What the overlap races on stays vLLM's own code, interpreted:
the request state's rows and last_sampled_tokens (post_update, combine_sampled_and_draft_tokens,
the input ids and positions), the penalties' counts, bad words, logit bias. The equivalents:

- the Gumbel sample (gumbel_sample): temperature, then for a row with a temperature the argmax of
  logits plus Gumbel noise drawn from a 32-bit murmur3 hash of (the request's seed, the token's
  position, the token id), as vLLM's kernel draws it (the noise depends on the position, so a
  position off by one draws other noise); greedy rows a plain argmax. Our own code from that
  description; float rounding of the noise may differ from the kernel's, so a seeded sample is
  not promised to be bit-equal to a GPU's vLLM (docs/vllm-v2.md);
- the temperature kernel (logits / T for rows whose T is neither 0 nor 1);
- the logprobs of chosen tokens (log-softmax in float32, gathered) and the sampled token's rank
  (how many logits are >= its own).

Each call is counted in the worker's facts (v2_pytorch_kernels), and the verdict names the
adaptation (harness.targets.vllm.target.what_ran). The spec-decode paths (a logits cache, drafting) and
fp64 Gumbel keep vLLM's kernel.
"""
from __future__ import annotations

import os

import torch

M32 = 0xFFFFFFFF


def interpreted(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


def _count(name: str) -> None:
    from harness.agents.vllm.v2 import shared
    shared.facts("worker").add(f"v2_pytorch_{name}")


# -- murmur3 (32-bit), on int64 tensors holding uint32 values -----------------------------------
def _rotl(x, r):
    return ((x << r) | (x >> (32 - r))) & M32


def _mix(h, k):
    k = (k * 0xCC9E2D51) & M32
    k = _rotl(k, 15)
    k = (k * 0x1B873593) & M32
    h = _rotl(h ^ k, 13)
    return (h * 5 + 0xE6546B64) & M32


def _final(h):
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def hash32(seed: torch.Tensor, pos: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """murmur3 of four 32-bit words (seed low, seed high, position low, key), length 16.
    seed and pos: [rows, 1] int64; key: [1, cols] int64; returns [rows, cols] in 0..2**32-1.
    (int64 products wrap; the low 32 bits we keep are exact.) The words of a row and the key's
    own scrambling are mixed once per row and once per column; only the last mix and the
    finaliser run per element, in place (a step hashes rows x 49152 words here)."""
    h = torch.zeros_like(seed)
    h = _mix(h, seed & M32)
    h = _mix(h, (seed >> 32) & M32)
    h = _mix(h, pos & M32)
    k = (key & M32) * 0xCC9E2D51 & M32
    k = (_rotl(k, 15) * 0x1B873593) & M32
    x = h ^ k  # [rows, cols]
    x = ((x << 13) | (x >> 19)).bitwise_and_(M32)
    x.mul_(5).add_(0xE6546B64).bitwise_and_(M32).bitwise_xor_(16)
    x.bitwise_xor_(x >> 16).mul_(0x85EBCA6B).bitwise_and_(M32)
    x.bitwise_xor_(x >> 13).mul_(0xC2B2AE35).bitwise_and_(M32)
    return x.bitwise_xor_(x >> 16)


def uniform(seed, pos, key) -> torch.Tensor:
    """A float32 in (0, 1) from the hash: both 16-bit halves converted exactly, then summed."""
    r = hash32(seed, pos, key)
    return ((r >> 16).to(torch.float32) * (1.0 / 65536)
            + ((r & 0xFFFF).to(torch.float32) + 0.5) * (1.0 / 4294967296))


def gumbel_argmax(logits, expanded_idx_mapping, temperature, seed, pos, apply_temperature: bool):
    rows = expanded_idx_mapping.to(torch.int64)
    valid = rows >= 0
    safe = rows.clamp(min=0)
    temp = torch.where(valid, temperature[safe].to(torch.float32), torch.zeros((), dtype=torch.float32))
    x = logits.to(torch.float32, copy=True)  # the caller keeps its processed logits
    hot = temp != 0
    if apply_temperature and bool(hot.any()):
        x = torch.where(hot[:, None], x / torch.where(hot, temp, 1.0)[:, None], x)
    if bool(hot.any()):
        s = torch.where(valid, seed[safe].to(torch.int64), 0)[hot][:, None]
        p = pos.to(torch.int64)[hot][:, None]
        key = torch.arange(x.shape[1], dtype=torch.int64)[None, :]
        u = uniform(s, p, key)
        noise = -torch.log(-torch.log1p(-u))
        x[hot] = x[hot] + noise
    return x.argmax(dim=-1)  # the first maximum, as the kernel's blocks combine


# -- the patches (make(orig) -> replacement), applied by harness.agents.vllm.v2.agent ----------
def gumbel_sample(orig):
    def sample(logits, expanded_idx_mapping, temperature, seed, pos, apply_temperature, is_drafting,
               logits_cache=None, logits_cache_col=None, use_fp64=False, *a, **kw):
        plain = logits_cache is None and not is_drafting and not use_fp64 and not a and \
            kw.get("bias") is None and kw.get("logits_cache_source") is None
        if not (plain and interpreted(logits)):
            return orig(logits, expanded_idx_mapping, temperature, seed, pos, apply_temperature, is_drafting,
                        logits_cache, logits_cache_col, use_fp64, *a, **kw)
        _count("gumbel_sample")
        return gumbel_argmax(logits, expanded_idx_mapping, temperature, seed, pos, apply_temperature)
    return sample


def apply_temperature(orig):
    def apply(logits, expanded_idx_mapping, temperature, *a, **kw):
        if a or kw or not interpreted(logits):
            return orig(logits, expanded_idx_mapping, temperature, *a, **kw)
        _count("apply_temperature")
        rows = expanded_idx_mapping.to(torch.int64)
        t = torch.where(rows >= 0, temperature[rows.clamp(min=0)].to(torch.float32), 0.0)
        scale = (t != 0) & (t != 1)
        if bool(scale.any()):  # in place, as the kernel writes the logits
            logits[scale] = (logits[scale].to(torch.float32) / t[scale][:, None]).to(logits.dtype)
    return apply


def token_logprobs(orig):
    def compute(logits, token_ids, *a, **kw):
        if a or kw or not interpreted(logits):
            return orig(logits, token_ids, *a, **kw)
        _count("compute_token_logprobs")
        lp = torch.log_softmax(logits.to(torch.float32), dim=-1)
        return lp.gather(-1, token_ids.to(torch.int64))
    return compute


class _RanksLaunch:
    """Stands where vLLM's module launches its ranks kernel (`kernel[grid](...)`): under the
    interpreter on CPU tensors, each row's rank of its token (logits >= the token's logit)."""

    def __init__(self, orig):
        self.orig = orig

    def __getitem__(self, grid):
        def launch(output, logits, logits_stride, token_ids, vocab_size, *a, **kw):
            if not interpreted(logits):
                return self.orig[grid](output, logits, logits_stride, token_ids, vocab_size, *a, **kw)
            _count("ranks")
            x = logits[:, :vocab_size]
            own = x.gather(-1, token_ids.to(torch.int64).view(-1, 1))
            output.copy_((x >= own).sum(dim=-1).to(output.dtype))
        return launch


def ranks_kernel(orig):
    return _RanksLaunch(orig)


# point (harness.agents.vllm.v2.points) -> the patch that puts our equivalent there
PATCHES = {"v2_gumbel_sample": gumbel_sample, "v2_temperature": apply_temperature,
           "v2_token_logprobs": token_logprobs, "v2_prompt_token_logprobs": token_logprobs,
           "v2_ranks_kernel": ranks_kernel}


class _GrammarLaunch:
    """Stands where vLLM launches its grammar bitmask kernel. Triton's interpreter cannot run it
    (its store's mask, built from the unpacked bits, has a dtype the interpreter refuses: "mask has
    unsupported dtype"), which killed the engine on the first structured-output request, async on
    and off. Under the interpreter on CPU tensors: for each bitmask row, the logits row it maps to
    (request `mapping // MASK_STRIDE`, its position `mapping % MASK_STRIDE`, skipped past that
    request's logits) gets -inf wherever the token's bit is 0."""

    def __init__(self, orig):
        self.orig = orig

    def __getitem__(self, grid):
        def launch(logits, logits_stride, logits_indices, cu_num_logits, bitmask, bitmask_stride, vocab_size,
                   *a, MASK_STRIDE=1, **kw):
            if a or not interpreted(logits):
                return self.orig[grid](logits, logits_stride, logits_indices, cu_num_logits, bitmask,
                                       bitmask_stride, vocab_size, *a, MASK_STRIDE=MASK_STRIDE, **kw)
            _count("grammar_bitmask")
            n = grid[0]
            mapping = logits_indices[:n].to(torch.int64)
            req, position = mapping // MASK_STRIDE, mapping % MASK_STRIDE
            cu = cu_num_logits.to(torch.int64)
            start = cu[req]
            active = position < (cu[req + 1] - start)
            tokens = torch.arange(vocab_size)
            words = bitmask[:n].to(torch.int64)[:, tokens // 32]  # [n, vocab]
            banned = ((words >> (tokens % 32)) & 1) == 0
            for b in torch.nonzero(active).flatten().tolist():
                logits[int(start[b] + position[b]), :vocab_size].masked_fill_(banned[b], float("-inf"))
        return launch


def grammar_kernel(orig):
    return _GrammarLaunch(orig)


PATCHES["v2_grammar_kernel"] = grammar_kernel


class _ResampleLaunch:
    """Stands where V2's rejection sampler launches `_resample_kernel[(num_reqs, blocks)](...)`
    (spec_decode/rejection_sampler_utils.py): for each request, the token after its accepted
    drafts: the bonus token (every draft accepted) or the correction of the first rejected one,
    drawn from the residual (the target's processed logits without the rejected draft: a one-hot
    draft, as the n-gram drafter's) by Gumbel-max with the request's seed at that token's
    position; a greedy request's correction is the target's argmax the verify already wrote
    (skipped, as the kernel skips it). Written as the kernel writes it: per vocabulary block,
    the noised maximum and its token. Measured (2026-12-07, 8 requests x 4 logits rows, half
    seeded): the interpreted kernel was 7.5 of the rejection sampler's 8.4 s a step, hashing the
    noise of 48 blocks a row in interpreted numpy. Only the one-hot, fp32, unwatermarked draw of
    vLLM 0.32.0-0.33.0's launch (26 arguments) is ours; anything else keeps vLLM's kernel."""

    def __init__(self, orig):
        self.orig = orig

    def __getitem__(self, grid):
        def launch(*a, BLOCK_SIZE, HAS_DRAFT_LOGITS, USE_FP64, USE_BLOCK_VERIFICATION, CONTEXT_WIDTH, WATERMARK,
                   DEDUPLICATE_CONTEXTS, **kw):
            flags = dict(BLOCK_SIZE=BLOCK_SIZE, HAS_DRAFT_LOGITS=HAS_DRAFT_LOGITS, USE_FP64=USE_FP64,
                         USE_BLOCK_VERIFICATION=USE_BLOCK_VERIFICATION, CONTEXT_WIDTH=CONTEXT_WIDTH,
                         WATERMARK=WATERMARK, DEDUPLICATE_CONTEXTS=DEDUPLICATE_CONTEXTS)
            if len(a) != 26 or kw or HAS_DRAFT_LOGITS or USE_FP64 or WATERMARK or not interpreted(a[4]):
                return self.orig[grid](*a, **flags, **kw)
            _count("resample")
            resample(*a[:6], *a[11:18], a[25], BLOCK_SIZE, int(grid[0]), int(grid[1]))
        return launch


def resample(out_argmax, argmax_stride, out_max, max_stride, target, target_stride, rejected_step, cu_num_logits,
             expanded_idx_mapping, draft_sampled, temperature, seed, pos, vocab_size, block, rows, blocks) -> None:
    am = out_argmax.as_strided((rows, blocks), (argmax_stride, 1))
    mx = out_max.as_strided((rows, blocks), (max_stride, 1))
    tl = target.as_strided((target.shape[0], int(vocab_size)), (target_stride, 1))
    keys = torch.arange(blocks * block, dtype=torch.int64)[None, :]
    for r in range(rows):
        tok = int(cu_num_logits[r]) + int(rejected_step[r])
        ridx = int(expanded_idx_mapping[tok])
        t = float(temperature[ridx])
        bonus = tok == int(cu_num_logits[r + 1]) - 1
        if t == 0.0 and not bonus:
            continue  # greedy, a correction: the verify wrote the target's argmax
        x = torch.full((blocks * block,), float("-inf"), dtype=torch.float32)
        x[:int(vocab_size)] = tl[tok].to(torch.float32)
        rejected = int(draft_sampled[tok + 1]) if not bonus else -1
        if rejected >= 0:
            x[rejected] = float("-inf")  # the residual of a one-hot draft
        if t != 0.0:
            u = uniform(torch.tensor([[int(seed[ridx])]]), torch.tensor([[int(pos[tok])]]), keys)[0]
            x = torch.where(torch.isinf(x) & (x < 0), x, x + -torch.log(-torch.log1p(-u)))
        v, i = x.view(blocks, block).max(dim=-1)
        am[r].copy_((torch.arange(blocks) * block + i).to(am.dtype))
        mx[r].copy_(v.to(mx.dtype))


PATCHES["v2_resample_kernel"] = _ResampleLaunch
