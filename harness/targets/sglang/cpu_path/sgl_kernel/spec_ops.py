"""Speculative decoding's CPU kernel operations, in plain PyTorch, written from what each must compute.

SGLang 0.5.23's speculative modules import these from a CPU build of sgl_kernel (none on the package
index, see ../README.md). Each follows the contract its caller states (names and argument order of
the callers in sglang/kernels/ops/speculative/: cache_locs.py, eagle.py, spec_tree.py), writes its
outputs in place as a kernel does, and runs synchronously on the host. The speculative work itself
(drafting, the verify pass, acceptance, the relay) stays SGLang's; these only move indices around.

A window of `n` positions per request is laid out flat, request after request (b * n + i); a tree
mask is [bs, n, n] flat, mask[b, i, j] saying node j is visible to node i (an ancestor, or i itself).
"""
from __future__ import annotations

import torch


def assign_extend_cache_locs_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """The reverse of assign_req_to_token_pool_cpu: read the slots of row req_pool_indices[i],
    positions [start_offset[i], end_offset[i]), into out_cache_loc, the rows packed one after another.
    NGRAM's verify window takes its KV slots this way (the two windows reserved before the step)."""
    at = 0
    for row, s, e in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        if e <= s:
            continue
        if e > pool_len:
            raise IndexError(f"req_to_token row {row}: end {e} past its length {pool_len}")
        out_cache_loc[at:at + e - s] = req_to_token[row, s:e].to(out_cache_loc.dtype)
        at += e - s


def assign_draft_cache_locs_contiguous_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                           seq_lens: torch.Tensor, out_cache_loc: torch.Tensor,
                                           pool_len: int, topk: int, num_cols: int) -> None:
    """Each request's topk * num_cols slots from seq_lens on, request after request."""
    width = topk * num_cols
    ends = seq_lens.to(torch.int64) + width
    assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, seq_lens, ends, out_cache_loc, pool_len)


def fill_accept_out_cache_loc_cpu(accept_index: torch.Tensor, out_cache_loc: torch.Tensor,
                                  accept_out_cache_loc: torch.Tensor) -> None:
    """The KV slots of the accepted positions, compacted in order: accept_index holds flat window
    positions, -1 for the rows past a request's accepted length."""
    flat = accept_index.reshape(-1).to(torch.int64)
    kept = flat[flat >= 0]
    accept_out_cache_loc[:kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def fill_bonus_tokens_cpu(accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor,
                          accept_stride: int) -> None:
    """Request b's bonus token: the last of its accepted tokens (accept_lens counts the bonus), in a
    row of accept_stride tokens."""
    flat = accept_tokens.reshape(-1)
    for b, n in enumerate(accept_lens.tolist()):
        bonus_tokens[b] = flat[b * accept_stride + int(n) - 1]


def tree_links(tree_mask: torch.Tensor, bs: int, n: int) -> tuple[list[list[int]], torch.Tensor]:
    """(parents, depth) of each request's draft tree: node i's parent is its nearest strict
    ancestor (the largest j < i the mask shows it), -1 for a root; depth counts strict ancestors."""
    m = tree_mask.reshape(bs, n, n).to(torch.bool)
    strict = m & torch.ones(n, n, dtype=torch.bool).tril(-1)
    depth = strict.sum(-1)
    parents = []
    for b in range(bs):
        row = []
        for i in range(n):
            anc = strict[b, i].nonzero().flatten()
            row.append(int(anc.max()) if anc.numel() else -1)
        parents.append(row)
    return parents, depth


def reconstruct_indices_from_tree_mask(tree_mask: torch.Tensor, verified_seq_len: torch.Tensor,
                                       positions: torch.Tensor, retrieve_index: torch.Tensor,
                                       retrieve_next_token: torch.Tensor, retrieve_next_sibling: torch.Tensor,
                                       batch_size: int, draft_token_num: int) -> None:
    """NGRAM's verify metadata from its tree mask: each node's position (the request's verified
    length plus its depth), its flat index, its first child and its next sibling (-1: none)."""
    bs, n = batch_size, draft_token_num
    if bs == 0:
        return
    parents, depth = tree_links(tree_mask, bs, n)
    base = verified_seq_len[:bs].to(torch.int64).reshape(bs, 1)
    positions[:bs * n] = (base + depth).reshape(-1).to(positions.dtype)
    retrieve_index[:bs] = torch.arange(bs * n, dtype=retrieve_index.dtype).reshape(bs, n)
    nxt = torch.full((bs, n), -1, dtype=torch.int64)
    sib = torch.full((bs, n), -1, dtype=torch.int64)
    for b in range(bs):
        par = parents[b]
        for i in range(n):
            kids = [k for k in range(i + 1, n) if par[k] == i]
            if kids:
                nxt[b, i] = kids[0]
            if par[i] >= 0:
                later = [k for k in range(i + 1, n) if par[k] == par[i]]
                if later:
                    sib[b, i] = later[0]
    retrieve_next_token[:bs] = nxt.to(retrieve_next_token.dtype)
    retrieve_next_sibling[:bs] = sib.to(retrieve_next_sibling.dtype)


def verify_tree_greedy_cpu(predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor,
                           candidates: torch.Tensor, retrive_index: torch.Tensor, retrive_next_token: torch.Tensor,
                           retrive_next_sibling: torch.Tensor, target_predict: torch.Tensor) -> None:
    """Greedy acceptance down a draft tree. From the root (the request's last token), step to the
    child whose draft token equals the target's prediction at the current node, as long as one does
    (at most accept_index.shape[1] - 1 drafts). The accepted path's flat indices go to accept_index
    (root first, -1 left past it), the number of accepted drafts to accept_token_num, and each node
    on the path gets the target's token in predicts: the next node's draft where accepted, and the
    bonus token at the last one."""
    bs, n = candidates.shape
    depth = accept_index.shape[1]
    target = target_predict.reshape(-1)
    cand, ridx = candidates.tolist(), retrive_index.tolist()
    nxt, sib = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    for b in range(bs):
        last = ridx[b][0]
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, depth):
            want = int(target[last])
            cur = nxt[b][cur]
            while cur != -1 and cand[b][cur] != want:
                cur = sib[b][cur]
            if cur == -1:
                break
            predicts[last] = want
            accepted += 1
            last = ridx[b][cur]
            accept_index[b, accepted] = last
        accept_token_num[b] = accepted
        predicts[last] = target[last]

