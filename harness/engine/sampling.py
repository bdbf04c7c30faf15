"""Sampling on the device: greedy, and seeded temperature / top-p whose draw
depends only on (seed, request, position), so a sampled output does not depend
on the batch, on overlap, or on when a retracted request is recomputed."""
from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def _mix(x: torch.Tensor) -> torch.Tensor:
    # a 32-bit avalanche hash in int64 arithmetic (every product stays below 2**63)
    x = x & _M32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _M32
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & _M32
    return x ^ (x >> 16)


def uniform(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[B] int64 seeds and positions -> [B] float32 in [0, 1), exactly reproducible."""
    h = _mix(_mix(seeds) ^ ((positions * 0x9E3779B1) & _M32))
    return (h & 0xFFFFFF).to(torch.float32) / float(1 << 24)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, seeds: torch.Tensor,
           positions: torch.Tensor, any_sampled: bool | None = None) -> torch.Tensor:
    """logits: [B, V]; temperature, top_p: [B] float32; seeds, positions: [B] int64 -> tokens [B] int64.
    Rows with temperature 0 are greedy (first maximum on ties). `any_sampled` is the CPU's
    knowledge of the batch; without it the check reads the device (a host sync on a GPU)."""
    greedy = torch.argmax(logits, dim=-1)
    if any_sampled is None:
        any_sampled = bool((temperature > 0).any())
    if not any_sampled:
        return greedy
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    probs = torch.softmax(logits / t[:, None], dim=-1)
    sp, idx = torch.sort(probs, dim=-1, descending=True, stable=True)
    cum = torch.cumsum(sp, dim=-1)
    keep = (cum - sp) < top_p[:, None]  # the first token is always kept
    sp = sp * keep
    cum = torch.cumsum(sp, dim=-1)
    u = uniform(seeds, positions) * cum[:, -1]
    pick = torch.searchsorted(cum, u[:, None], right=True).clamp_(max=sp.shape[1] - 1)
    sampled = idx.gather(1, pick).squeeze(1)
    return torch.where(temperature > 0, sampled, greedy)
