"""A Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU) whose
attention finds each request's KV slots through the slot table.

Batch invariance, by construction and checked in tests/test_model.py: on the CPU a
float32 matmul gives a row the same result whatever the other rows are only when
the row count is a multiple of 4, and a softmax/PV reduction only when its length
is fixed. So every matmul here runs on a row count padded to a multiple of 4 (as
CUDA graphs pad a batch to a recorded size), and attention always reduces over
the full row width `max_context`, masking positions past the query's own.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from harness.engine.config import ModelConfig

ROW_ALIGN = 4


def pad_rows(n: int) -> int:
    return max(ROW_ALIGN, -(-n // ROW_ALIGN) * ROW_ALIGN)


def _pad_to(x: torch.Tensor, rows: int) -> torch.Tensor:
    if x.shape[0] == rows:
        return x
    return torch.cat([x, x.new_zeros((rows - x.shape[0],) + tuple(x.shape[1:]))])


def init_tiny_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights with HF Llama names, scaled so activations stay O(1)."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale=None):
        s = scale if scale is not None else 1.0 / math.sqrt(shape[-1])
        return torch.randn(*shape, generator=g) * s

    H, d, kv = cfg.hidden, cfg.head_dim, cfg.kv_heads
    out = {"model.embed_tokens.weight": w(cfg.vocab_size, H, scale=1.0), "model.norm.weight": torch.ones(H)}
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = torch.ones(H)
        out[p + "post_attention_layernorm.weight"] = torch.ones(H)
        # a gain of 2 on q and k sharpens attention, so outputs depend on which KV entries are read
        out[p + "self_attn.q_proj.weight"] = w(cfg.heads * d, H, scale=2.0 / math.sqrt(H))
        out[p + "self_attn.k_proj.weight"] = w(kv * d, H, scale=2.0 / math.sqrt(H))
        out[p + "self_attn.v_proj.weight"] = w(kv * d, H)
        out[p + "self_attn.o_proj.weight"] = w(H, cfg.heads * d)
        out[p + "mlp.gate_proj.weight"] = w(cfg.intermediate, H)
        out[p + "mlp.up_proj.weight"] = w(cfg.intermediate, H)
        out[p + "mlp.down_proj.weight"] = w(H, cfg.intermediate)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = w(cfg.vocab_size, H)
    return out


class Model:
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], device: torch.device):
        self.cfg = cfg
        self.device = device
        self.w = {k: v.to(device=device, dtype=torch.float32).contiguous() for k, v in weights.items()}
        lm = self.w.get("lm_head.weight")
        self.lm_head = lm if lm is not None and not cfg.tie_embeddings else self.w["model.embed_tokens.weight"]
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
        self.inv_freq = inv.to(device)
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        self.n_rep = cfg.heads // cfg.kv_heads

    # -- pieces ----------------------------------------------------------------
    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(var + self.cfg.rms_eps))

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [N, heads, head_dim]; HF rotate_half convention
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rot * sin

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qpos: torch.Tensor) -> torch.Tensor:
        """q: [G, kv_heads, R, d] (R = query rows of a group, a multiple of 4);
        k, v: [G, kv_heads, L, d]; qpos: [G, R] position of each query row (-1: padding).
        Returns [G, kv_heads, R, d]."""
        L = k.shape[2]
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale  # [G, kv, R, L]
        keypos = torch.arange(L, device=q.device)
        masked = keypos[None, None, :] > qpos[:, :, None]  # [G, R, L]
        scores = scores.masked_fill(masked[:, None], float("-inf"))
        scores = scores.masked_fill((qpos < 0)[:, None, :, None], 0.0)  # padded rows: any finite row
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    # -- the pass ----------------------------------------------------------------
    def forward(self, input_ids, positions, out_loc, groups, kv_indices, kv_k, kv_v) -> torch.Tensor:
        """One pass over N tokens (N a multiple of 4).

        input_ids, positions, out_loc: [N]; out_loc is the KV slot each token's entry is written to.
        groups: list of (start, count) per request, its tokens contiguous in the batch.
        kv_indices: [len(groups), max_context] slot of every position of each request's row.
        kv_k, kv_v: per layer [slots, kv_heads, head_dim] (the KV pool).
        Returns the final hidden states [N, hidden].
        """
        cfg = self.cfg
        N = input_ids.shape[0]
        x = F.embedding(input_ids, self.w["model.embed_tokens.weight"])
        decode = all(c == 1 for _, c in groups) and len(groups) == N
        for i in range(cfg.layers):
            p = f"model.layers.{i}."
            h = self._rms(x, self.w[p + "input_layernorm.weight"])
            q = F.linear(h, self.w[p + "self_attn.q_proj.weight"]).view(N, cfg.heads, cfg.head_dim)
            k = F.linear(h, self.w[p + "self_attn.k_proj.weight"]).view(N, cfg.kv_heads, cfg.head_dim)
            v = F.linear(h, self.w[p + "self_attn.v_proj.weight"]).view(N, cfg.kv_heads, cfg.head_dim)
            q, k = self._rope(q, positions), self._rope(k, positions)
            kv_k[i].index_copy_(0, out_loc, k)
            kv_v[i].index_copy_(0, out_loc, v)
            attn = self._attention(q, positions, groups, kv_indices, kv_k[i], kv_v[i], decode)
            x = x + F.linear(attn, self.w[p + "self_attn.o_proj.weight"])
            h = self._rms(x, self.w[p + "post_attention_layernorm.weight"])
            g = F.linear(h, self.w[p + "mlp.gate_proj.weight"])
            u = F.linear(h, self.w[p + "mlp.up_proj.weight"])
            x = x + F.linear(F.silu(g) * u, self.w[p + "mlp.down_proj.weight"])
        return self._rms(x, self.w["model.norm.weight"])

    def _attention(self, q, positions, groups, kv_indices, k_pool, v_pool, decode: bool) -> torch.Tensor:
        cfg, rep = self.cfg, self.n_rep
        N = q.shape[0]
        out = q.new_zeros(N, cfg.heads * cfg.head_dim)
        if decode:
            # one query per request: rows of a kv group are its rep query heads, padded to 4
            B = N
            R = pad_rows(rep)
            qq = q.view(B, cfg.kv_heads, rep, cfg.head_dim)
            if R != rep:
                qq = torch.cat([qq, qq.new_zeros(B, cfg.kv_heads, R - rep, cfg.head_dim)], dim=2)
            k = k_pool[kv_indices[:B]].permute(0, 2, 1, 3)  # [B, kv, L, d]
            v = v_pool[kv_indices[:B]].permute(0, 2, 1, 3)
            qpos = positions[:, None].expand(B, R).clone()
            qpos[:, rep:] = -1
            o = self._attend(qq, k, v, qpos)[:, :, :rep]  # [B, kv, rep, d]
            return o.reshape(B, cfg.heads * cfg.head_dim)
        for b, (start, n) in enumerate(groups):
            R = pad_rows(n * rep)
            qq = q[start:start + n].view(n, cfg.kv_heads, rep, cfg.head_dim).permute(1, 0, 2, 3)
            qq = qq.reshape(cfg.kv_heads, n * rep, cfg.head_dim)
            qq = torch.cat([qq, qq.new_zeros(cfg.kv_heads, R - n * rep, cfg.head_dim)], dim=1)[None]
            k = k_pool[kv_indices[b]].permute(1, 0, 2)[None]  # [1, kv, L, d]
            v = v_pool[kv_indices[b]].permute(1, 0, 2)[None]
            qpos = torch.full((1, R), -1, dtype=torch.long, device=q.device)
            qpos[0, :n * rep] = positions[start:start + n].repeat_interleave(rep)
            o = self._attend(qq, k, v, qpos)[0, :, :n * rep]  # [kv, n*rep, d]
            o = o.view(cfg.kv_heads, n, rep, cfg.head_dim).permute(1, 0, 2, 3).reshape(n, -1)
            out[start:start + n] = o
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [M, hidden] with M a multiple of 4 -> [M, vocab]."""
        return F.linear(hidden, self.lm_head)
