"""Speculative decoding on SGLang's CPU path without AMX: what a CPU build lacks, and the overlap kept on.

Imported by sitecustomize.py (which runs in SGLang's server processes only). The speculative kernels a
CPU build of sgl_kernel has are sgl_kernel/spec_ops.py (plain PyTorch, written from each op's contract,
imported by sgl_kernel/__init__.py). Two more gaps, each a hook that runs after the named SGLang
module's own code, the first time it is imported:

1. `torch_native` attention has no target-verify branch: a verify pass (every request's window of
   draft tokens at once, each token seeing the request's verified tokens and its own ancestors in
   the draft tree) took the plain extend branch, which has no extend lengths for it. The branch
   added here reads the window's KV slots from req_to_token as the AMX backend's does.
2. `speculative_hook._disable_overlap_schedule_for_cpu` turns the overlap off on the CPU for every
   drafter ("Overlap schedule is not implemented for speculative decoding on CPU"). That is a CPU
   adaptation of ours, stated in the gate's verdict: the hook keeps the overlap as asked (a server
   started with --disable-overlap-schedule still runs without), so SGLang's spec-v2 overlap loop
   (the relay, the two reserved windows) runs here. OVERLAP_KEPT names it in the server log.
"""
from __future__ import annotations

OVERLAP_KEPT = ("overlap-harness CPU adaptation: overlap kept on for speculative decoding on CPU "
                "(SGLang turns it off in speculative_hook._disable_overlap_schedule_for_cpu)")


def _keep_overlap(module) -> None:
    import logging
    log = logging.getLogger(module.__name__)

    def keep(server_args) -> None:
        if getattr(server_args, "device", None) == "cpu" and not getattr(server_args, "disable_overlap_schedule", True):
            log.warning(OVERLAP_KEPT)
    if hasattr(module, "_disable_overlap_schedule_for_cpu"):
        module._disable_overlap_schedule_for_cpu = keep


def verify_attention(q, k_cache, v_cache, table, rows, lens, n: int, tree, scale: float):
    """Attention of one verify pass. q: [bs * n, heads, dim], the windows request after request;
    request b's window attends to the first lens[b] + n slots of table row rows[b] (its verified
    tokens, then its window), a window node only to the nodes tree[b] ([n, n] bool) shows it, or to
    itself and the nodes before it where tree is None (a chain). Returns [bs * n, heads, dim]."""
    import torch
    from torch.nn.functional import scaled_dot_product_attention
    out = q.new_empty(q.shape[0], q.shape[1], v_cache.shape[-1])
    chain = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    for b, (row, pre) in enumerate(zip(rows, lens)):
        slots = table[row, :pre + n]
        key = k_cache[slots].movedim(0, 1).unsqueeze(0)  # [1, kv heads, pre + n, dim]
        val = v_cache[slots].movedim(0, 1).unsqueeze(0)
        qb = q[b * n:(b + 1) * n].movedim(0, 1).unsqueeze(0)
        allow = torch.ones(n, pre + n, dtype=torch.bool, device=q.device)
        allow[:, pre:] = tree[b] if tree is not None else chain
        if key.dtype != qb.dtype:
            key, val = key.to(qb.dtype), val.to(qb.dtype)
        o = scaled_dot_product_attention(qb, key, val, attn_mask=allow, scale=scale,
                                         enable_gqa=q.shape[1] != k_cache.shape[1])
        out[b * n:(b + 1) * n] = o.squeeze(0).movedim(0, 1)
    return out


def _target_verify(self, q, k, v, layer, forward_batch, save_kv_cache=True):
    """torch_native's verify pass: the window's KV into its reserved slots, then verify_attention."""
    import torch
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    if save_kv_cache and k is not None and v is not None:
        self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc),
                                            k, v)
    spec = forward_batch.spec_info
    n, bs = spec.draft_token_num, forward_batch.batch_size
    mask = getattr(spec, "custom_mask", None)
    tree = mask.reshape(-1)[:bs * n * n].reshape(bs, n, n).to(torch.bool) if mask is not None and mask.numel() else None
    o = verify_attention(q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
                         self.token_to_kv_pool.get_key_buffer(layer.layer_id),
                         self.token_to_kv_pool.get_value_buffer(layer.layer_id),
                         self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices.tolist(),
                         [int(x) for x in forward_batch.seq_lens.tolist()], n, tree, layer.scaling)
    return o.reshape(q.shape[0], layer.tp_q_head_num * layer.v_head_dim)


def _verify_branch(module) -> None:
    cls = getattr(module, "TorchNativeAttnBackend", None)
    if cls is None or getattr(cls, "_overlap_harness_verify", False):
        return
    extend = cls.forward_extend

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if forward_batch.forward_mode.is_target_verify():
            return _target_verify(self, q, k, v, layer, forward_batch, save_kv_cache)
        return extend(self, q, k, v, layer, forward_batch, save_kv_cache)
    cls.forward_extend = forward_extend
    cls._overlap_harness_verify = True


HOOKS = {"sglang.srt.arg_groups.speculative_hook": _keep_overlap,
         "sglang.srt.layers.attention.torch_native_backend": _verify_branch}


def install(after: dict) -> None:
    """Add these hooks to sitecustomize's after-import table, after any hook already there."""
    for name, hook in HOOKS.items():
        old = after.get(name)
        if old is None:
            after[name] = hook
        else:
            def both(module, _old=old, _new=hook):
                _old(module)
                _new(module)
            after[name] = both
