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

    def _attend(self, q, k, v, masked, padrow) -> torch.Tensor:
        """q: [G, kv_heads, R, d] (R query rows, a multiple of 4); k, v: [G, kv_heads, L, d];
        masked: [G, 1, R, L] keys a row may not see; padrow: [G, 1, R, 1] padding rows."""
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale  # [G, kv, R, L]
        scores = scores.masked_fill(masked, float("-inf")).masked_fill(padrow, 0.0)  # padded rows: any finite row
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    def pass_context(self, positions, groups, kv_indices) -> dict:
        """What every layer of one pass shares: RoPE tables, masks, gather indices (built once)."""
        cfg, rep = self.cfg, self.n_rep
        N, L = positions.shape[0], kv_indices.shape[1]
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        ctx = {"cos": emb.cos()[:, None, :], "sin": emb.sin()[:, None, :], "groups": groups,
               "kv_indices": kv_indices, "positions": positions, "N": N}
        keypos = torch.arange(L, device=positions.device)
        ctx["decode"] = decode = all(c == 1 for _, c in groups) and len(groups) == N
        if decode:  # one query per request: a kv group's rows are its rep query heads, padded to 4
            R = pad_rows(rep)
            qpos = positions[:, None].expand(N, R).clone()
            qpos[:, rep:] = -1
            ctx["flat"] = kv_indices[:N].reshape(-1)
            ctx["masked"] = (keypos[None, None, :] > qpos[:, :, None])[:, None]  # [N, 1, R, L]
            ctx["padrow"] = (qpos < 0)[:, None, :, None]
            ctx["R"] = R
        else:
            ctx["per_group"] = []
            for b, (start, n) in enumerate(groups):
                R = pad_rows(n * rep)
                qpos = torch.full((1, R), -1, dtype=torch.long, device=positions.device)
                qpos[0, :n * rep] = positions[start:start + n].repeat_interleave(rep)
                ctx["per_group"].append(((keypos[None, None, :] > qpos[:, :, None])[:, None],
                                         (qpos < 0)[:, None, :, None], R))
        return ctx

    def _rope(self, x: torch.Tensor, ctx: dict) -> torch.Tensor:
        # x: [N, heads, head_dim]; HF rotate_half convention
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * ctx["cos"] + rot * ctx["sin"]

    def layer(self, p: str, x: torch.Tensor, ctx: dict, out_loc, k_pool, v_pool) -> torch.Tensor:
        """One decoder layer (weights under prefix p) over x [N, hidden]; writes this pass's KV
        at out_loc into the pools, then attends through the slots of each request's row."""
        cfg, N = self.cfg, ctx["N"]
        h = self._rms(x, self.w[p + "input_layernorm.weight"])
        q = F.linear(h, self.w[p + "self_attn.q_proj.weight"]).view(N, cfg.heads, cfg.head_dim)
        k = F.linear(h, self.w[p + "self_attn.k_proj.weight"]).view(N, cfg.kv_heads, cfg.head_dim)
        v = F.linear(h, self.w[p + "self_attn.v_proj.weight"]).view(N, cfg.kv_heads, cfg.head_dim)
        q, k = self._rope(q, ctx), self._rope(k, ctx)
        k_pool.index_copy_(0, out_loc, k)
        v_pool.index_copy_(0, out_loc, v)
        attn = self._attention(q, ctx, k_pool, v_pool)
        x = x + F.linear(attn, self.w[p + "self_attn.o_proj.weight"])
        h = self._rms(x, self.w[p + "post_attention_layernorm.weight"])
        g = F.linear(h, self.w[p + "mlp.gate_proj.weight"])
        u = F.linear(h, self.w[p + "mlp.up_proj.weight"])
        return x + F.linear(F.silu(g) * u, self.w[p + "mlp.down_proj.weight"])

    # -- the pass ----------------------------------------------------------------
    def forward(self, input_ids, positions, out_loc, groups, kv_indices, kv_k, kv_v) -> torch.Tensor:
        """One pass over N tokens (N a multiple of 4).

        input_ids, positions, out_loc: [N]; out_loc is the KV slot each token's entry is written to.
        groups: list of (start, count) per request, its tokens contiguous in the batch.
        kv_indices: [len(groups), max_context] slot of every position of each request's row.
        kv_k, kv_v: per layer [slots, kv_heads, head_dim] (the KV pool).
        Returns the final hidden states [N, hidden].
        """
        ctx = self.pass_context(positions, groups, kv_indices)
        x = F.embedding(input_ids, self.w["model.embed_tokens.weight"])
        for i in range(self.cfg.layers):
            x = self.layer(f"model.layers.{i}.", x, ctx, out_loc, kv_k[i], kv_v[i])
        return self._rms(x, self.w["model.norm.weight"])

    def _attention(self, q, ctx, k_pool, v_pool) -> torch.Tensor:
        cfg, rep, N = self.cfg, self.n_rep, ctx["N"]
        kvh, d = cfg.kv_heads, cfg.head_dim
        if ctx["decode"]:
            R, L = ctx["R"], ctx["kv_indices"].shape[1]
            qq = q.view(N, kvh, rep, d)
            if R != rep:
                qq = torch.cat([qq, qq.new_zeros(N, kvh, R - rep, d)], dim=2)
            k = k_pool.index_select(0, ctx["flat"]).view(N, L, kvh, d).permute(0, 2, 1, 3)  # [N, kv, L, d]
            v = v_pool.index_select(0, ctx["flat"]).view(N, L, kvh, d).permute(0, 2, 1, 3)
            o = self._attend(qq, k, v, ctx["masked"], ctx["padrow"])[:, :, :rep]  # [N, kv, rep, d]
            return o.reshape(N, cfg.heads * d)
        out = q.new_zeros(N, cfg.heads * d)
        for b, ((start, n), (masked, padrow, R)) in enumerate(zip(ctx["groups"], ctx["per_group"])):
            qq = q[start:start + n].view(n, kvh, rep, d).permute(1, 0, 2, 3).reshape(kvh, n * rep, d)
            qq = torch.cat([qq, qq.new_zeros(kvh, R - n * rep, d)], dim=1)[None]
            idx = ctx["kv_indices"][b]
            k = k_pool[idx].permute(1, 0, 2)[None]  # [1, kv, L, d]
            v = v_pool[idx].permute(1, 0, 2)[None]
            o = self._attend(qq, k, v, masked, padrow)[0, :, :n * rep]  # [kv, n*rep, d]
            out[start:start + n] = o.view(kvh, n, rep, d).permute(1, 0, 2, 3).reshape(n, -1)
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [M, hidden] with M a multiple of 4 -> [M, vocab]."""
        return F.linear(hidden, self.lm_head)
