"""The speculative kernels our SGLang CPU path supplies (harness/targets/sglang/cpu_path/sgl_kernel/
spec_ops.py) and torch_native's verify attention (speculative_cpu.verify_attention), each against a
straightforward reference computed another way: random trees, random tables, explicit softmax."""
from __future__ import annotations

import importlib.util
import math
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

CPU_PATH = Path(__file__).resolve().parents[1] / "harness" / "targets" / "sglang" / "cpu_path"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ops = _load("oh_spec_ops", CPU_PATH / "sgl_kernel" / "spec_ops.py")
spec_cpu = _load("oh_speculative_cpu", CPU_PATH / "speculative_cpu.py")


def random_tree(rng: random.Random, n: int) -> list[int]:
    """Parents of an n-node draft tree, node 0 the root, each parent before its child."""
    return [-1] + [rng.randrange(i) for i in range(1, n)]


def mask_of(parents: list[int]) -> torch.Tensor:
    """[n, n] bool: node j visible to node i when j is i or an ancestor of i."""
    n = len(parents)
    m = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            m[i, j] = True
            j = parents[j]
    return m


def test_assign_extend_cache_locs_packs_each_rows_slice():
    table = torch.arange(5 * 32, dtype=torch.int32).reshape(5, 32) * 7
    rows, starts, ends = torch.tensor([3, 0, 4]), torch.tensor([5, 0, 10]), torch.tensor([9, 2, 13])
    out = torch.full((9,), -1, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(rows, table, starts, ends, out, 32)
    want = torch.cat([table[3, 5:9], table[0, 0:2], table[4, 10:13]]).to(torch.int64)
    assert out.tolist() == want.tolist()
    with pytest.raises(IndexError):
        ops.assign_extend_cache_locs_cpu(rows, table, starts, ends + 30, out, 32)


def test_draft_cache_locs_take_topk_times_cols_from_each_length():
    table = torch.arange(3 * 20, dtype=torch.int64).reshape(3, 20)
    out = torch.empty(2 * 6, dtype=torch.int64)
    ops.assign_draft_cache_locs_contiguous_cpu(torch.tensor([2, 1]), table, torch.tensor([4, 11]), out, 20, 2, 3)
    assert out.tolist() == table[2, 4:10].tolist() + table[1, 11:17].tolist()


def test_fill_accept_out_cache_loc_compacts_the_accepted_positions():
    accept = torch.tensor([[0, 1, -1], [4, -1, -1], [6, 7, 8]], dtype=torch.int32)
    locs = torch.arange(100, 109)
    out = torch.full((9,), -1, dtype=torch.int64)
    ops.fill_accept_out_cache_loc_cpu(accept, locs, out)
    want = [int(locs[i]) for i in accept.flatten().tolist() if i != -1]
    assert out[:len(want)].tolist() == want and out[len(want):].eq(-1).all()


def test_fill_bonus_tokens_takes_each_rows_last_accepted_token():
    tokens = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]])
    lens = torch.tensor([1, 4, 2])
    bonus = torch.empty(3, dtype=torch.int64)
    ops.fill_bonus_tokens_cpu(tokens, lens, bonus, 4)
    assert bonus.tolist() == [10, 23, 31]  # a stride of 1 would be [10, 14?..]: each row its own


@pytest.mark.parametrize("seed", range(6))
def test_reconstruct_links_rebuild_the_tree(seed):
    rng = random.Random(seed)
    bs, n = 3, rng.choice([1, 2, 4, 8])
    trees = [random_tree(rng, n) for _ in range(bs)]
    mask = torch.stack([mask_of(t) for t in trees]).flatten()
    lens = torch.tensor([rng.randrange(1, 50) for _ in range(bs)])
    pos = torch.empty(bs * n, dtype=torch.int64)
    idx, nxt, sib = (torch.empty(bs, n, dtype=torch.int64) for _ in range(3))
    ops.reconstruct_indices_from_tree_mask(mask, lens, pos, idx, nxt, sib, bs, n)
    for b, parents in enumerate(trees):
        # walking first-child / next-sibling links from the root reaches every node once, from its parent
        seen, stack = {0: -1}, [0]
        while stack:
            node = stack.pop()
            child = int(nxt[b, node])
            while child != -1:
                assert child not in seen
                seen[child] = node
                stack.append(child)
                child = int(sib[b, child])
        assert seen == dict(enumerate(parents))
        for i in range(n):
            depth, j = 0, parents[i]
            while j >= 0:
                depth, j = depth + 1, parents[j]
            assert int(pos[b * n + i]) == int(lens[b]) + depth
        assert idx[b].tolist() == list(range(b * n, (b + 1) * n))


def trie(rng: random.Random, n: int, vocab: int) -> tuple[list[int], list[int]]:
    """A draft tree whose siblings carry distinct tokens (as NGRAM's trie and EAGLE's top-k do)."""
    while True:
        parents = random_tree(rng, n)
        toks = [rng.randrange(vocab) for _ in range(n)]
        kids: dict = {}
        if all(kids.setdefault((p, t), i) == i for i, (p, t) in enumerate(zip(parents, toks)) if p >= 0):
            return parents, toks


@pytest.mark.parametrize("seed", range(8))
def test_verify_tree_greedy_accepts_the_deepest_matching_path(seed):
    rng = random.Random(seed)
    bs, n, vocab, depth = 4, 6, 3, rng.choice([2, 4, 6])
    trees = [trie(rng, n, vocab) for _ in range(bs)]
    mask = torch.stack([mask_of(p) for p, _ in trees]).flatten()
    idx, nxt, sib = (torch.empty(bs, n, dtype=torch.int64) for _ in range(3))
    ops.reconstruct_indices_from_tree_mask(mask, torch.zeros(bs, dtype=torch.int64), torch.empty(bs * n, dtype=torch.int64),
                                           idx, nxt, sib, bs, n)
    cands = torch.tensor([t for _, t in trees])
    target = torch.randint(0, vocab, (bs, n))
    predicts = torch.zeros(bs * n, dtype=torch.int32)
    accept = torch.full((bs, depth), -1, dtype=torch.int32)
    num = torch.empty(bs, dtype=torch.int32)
    ops.verify_tree_greedy_cpu(predicts, accept, num, cands, idx, nxt, sib, target)
    want_predicts = torch.zeros(bs * n, dtype=torch.int32)
    for b, (parents, toks) in enumerate(trees):
        def path(i):
            return path(parents[i]) + [i] if i >= 0 else []
        # a node is accepted when every node on its path (the root aside) is the target's token at its parent
        ok = [i for i in range(n) if len(path(i)) <= depth
              and all(toks[j] == int(target[b, parents[j]]) for j in path(i)[1:])]
        best = max(ok, key=lambda i: len(path(i)))
        p = path(best)
        assert int(num[b]) == len(p) - 1
        assert accept[b].tolist() == [b * n + i for i in p] + [-1] * (depth - len(p))
        for i in p:
            want_predicts[b * n + i] = target[b, i]
    assert predicts.tolist() == want_predicts.tolist()


def reference_attention(q, keys, vals, visible, scale):
    """Explicit softmax over the visible keys, one query and head at a time."""
    out = torch.zeros(q.shape[0], vals.shape[-1], dtype=torch.float64)
    for t in range(q.shape[0]):
        ks = [j for j in range(keys.shape[0]) if visible[t][j]]
        w = torch.tensor([float(q[t] @ keys[j]) * scale for j in ks], dtype=torch.float64)
        w = torch.softmax(w, 0)
        out[t] = sum(w[i] * vals[j].double() for i, j in enumerate(ks))
    return out


@pytest.mark.parametrize("gqa,use_tree", [(False, True), (True, True), (False, False)])
def test_verify_attention_sees_the_prefix_and_the_windows_ancestors(gqa, use_tree):
    rng = random.Random(7)
    torch.manual_seed(7)
    heads, kv_heads, dim, n, slots = 4, (2 if gqa else 4), 8, 4, 64
    k_cache, v_cache = torch.randn(slots, kv_heads, dim), torch.randn(slots, kv_heads, dim)
    table = torch.stack([torch.randperm(slots - 1) + 1 for _ in range(3)])  # each row its own slot order
    rows, lens = [2, 0], [5, 9]
    trees = [random_tree(rng, n) for _ in rows]
    tree = torch.stack([mask_of(t) for t in trees]) if use_tree else None
    q = torch.randn(len(rows) * n, heads, dim)
    scale = 1 / math.sqrt(dim)
    out = spec_cpu.verify_attention(q, k_cache, v_cache, table, rows, lens, n, tree, scale)
    for b, (row, pre) in enumerate(zip(rows, lens)):
        slots_b = table[row, :pre + n]
        vis = [[True] * pre + [bool(tree[b, i, j]) if use_tree else j <= i for j in range(n)] for i in range(n)]
        for h in range(heads):
            kh = h // (heads // kv_heads)
            ref = reference_attention(q[b * n:(b + 1) * n, h], k_cache[slots_b, kh], v_cache[slots_b, kh], vis, scale)
            assert torch.allclose(out[b * n:(b + 1) * n, h].double(), ref, atol=1e-5)
