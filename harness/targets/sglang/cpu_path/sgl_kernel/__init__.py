"""The CPU operations SGLang's CPU backend imports from its kernel package, in plain PyTorch.

See ../README.md for why. Signatures follow SGLang 0.5.23's callers
(sglang/srt/mem_cache/allocation.py, sglang/kernels/ops/kvcache/cache_move.py). Both run
synchronously on the host, as a CPU kernel does.
"""
from __future__ import annotations

import ctypes

import torch

__version__ = "0.0.0+overlap-harness-cpu"
PROVIDED_BY_OVERLAP_HARNESS = True


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """Row i of the batch owns slot-table row req_pool_indices[i]; its positions
    [start_offset[i], end_offset[i]) get the next (end - start) entries of out_cache_loc, the rows
    packed one after another in batch order. req_to_token: [pool_rows, pool_len]."""
    starts, ends = start_offset.tolist(), end_offset.tolist()
    rows = req_pool_indices.tolist()
    at = 0
    for row, s, e in zip(rows, starts, ends):
        n = e - s
        if n <= 0:
            continue
        if e > pool_len:
            raise IndexError(f"req_to_token row {row}: end {e} past its length {pool_len}")
        req_to_token[row, s:e] = out_cache_loc[at:at + n].to(req_to_token.dtype)
        at += n


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                                src_loc: torch.Tensor) -> None:
    """For every KV buffer (one base address and one row size in bytes each), copy row src_loc[j]
    to row tgt_loc[j]. Sources are read in full before any target is written (safe in place)."""
    src, tgt = src_loc.tolist(), tgt_loc.tolist()
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        rows = [ctypes.string_at(base + s * stride, stride) for s in src]
        for t, data in zip(tgt, rows):
            ctypes.memmove(base + t * stride, data, stride)


# Speculative decoding's CPU kernels: SGLang's speculative modules import them at import time, on
# every CPU run. The harness attacks plain decoding on the CPU, so they are declared but not
# provided: a call names itself and fails the step (the target never enables speculation here).
class NotProvidedOnThisCpu(RuntimeError):
    pass


def _not_provided(name: str):
    def op(*args, **kwargs):
        raise NotProvidedOnThisCpu(f"sgl_kernel.{name}: SGLang's speculative decoding kernel has no plain-PyTorch "
                                   "version in overlap-harness's CPU path (harness/targets/sglang/cpu_path)")
    op.__name__ = name
    return op


for _name in ("build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu", "assign_draft_cache_locs_contiguous_cpu",
              "assign_extend_cache_locs_cpu", "fill_accept_out_cache_loc_cpu", "fill_bonus_tokens_cpu",
              "rotate_input_ids_cpu", "build_draft_decode_metadata_cpu"):
    globals()[_name] = _not_provided(_name)
