"""Batch invariance: a request's logits are bitwise identical whatever else is in the batch,
and whether its cache was filled by a prefill or by decode steps (retraction recomputes)."""
import random

import pytest
import torch

from harness.engine.build import load_model
from harness.engine.model import KV_CHUNK, Model, pad_rows

L = 256


class Rig:
    def __init__(self, width: int = L, slots: int = 4096):
        torch.set_num_threads(1)  # the engine's default (build_engine): a kernel's split may follow the thread count
        cfg, w, _ = load_model("tiny")
        self.cfg, self.m, self.L = cfg, Model(cfg, w, torch.device("cpu")), width
        self.k = [torch.zeros(slots, cfg.kv_heads, cfg.head_dim) for _ in range(cfg.layers)]
        self.v = [torch.zeros(slots, cfg.kv_heads, cfg.head_dim) for _ in range(cfg.layers)]
        self.next_slot = 1

    def slots(self, n):
        s = list(range(self.next_slot, self.next_slot + n))
        self.next_slot += n
        return s

    def prefill(self, reqs):
        """reqs: list of (tokens, slots, start): compute tokens[start:] with cache slots[:start] present."""
        ids, pos, loc, groups, kvidx = [], [], [], [], torch.zeros(len(reqs), self.L, dtype=torch.long)
        for g, (toks, slots, start) in enumerate(reqs):
            groups.append((len(ids), len(toks) - start))
            ids += toks[start:]
            pos += list(range(start, len(toks)))
            loc += slots[start:len(toks)]
            kvidx[g, :len(toks)] = torch.tensor(slots[:len(toks)])
        n = len(ids)
        N = pad_rows(n)
        pad = N - n
        h = self.m.forward(torch.tensor(ids + [0] * pad), torch.tensor(pos + [0] * pad),
                           torch.tensor(loc + [0] * pad), groups, kvidx, self.k, self.v)
        last = [s + c - 1 for s, c in groups]
        hh = h[last]
        M = pad_rows(len(last))
        hh = torch.cat([hh, hh.new_zeros(M - len(last), hh.shape[1])])
        return self.m.logits(hh)[:len(last)]

    def decode(self, reqs):
        """reqs: list of (token, position, slots): one token each."""
        B = len(reqs)
        N = pad_rows(B)
        kvidx = torch.zeros(N, self.L, dtype=torch.long)
        ids, pos, loc = [0] * N, [0] * N, [0] * N
        for b, (tok, p, slots) in enumerate(reqs):
            ids[b], pos[b], loc[b] = tok, p, slots[p]
            kvidx[b, :p + 1] = torch.tensor(slots[:p + 1])
        h = self.m.forward(torch.tensor(ids), torch.tensor(pos), torch.tensor(loc), [(i, 1) for i in range(N)],
                           kvidx, self.k, self.v)
        return self.m.logits(h)[:B]


def _seq(rng, n):
    return [rng.randrange(256) for _ in range(n)]


@pytest.mark.parametrize("seed", range(3))
def test_decode_logits_do_not_depend_on_batch(seed):
    rng = random.Random(seed)
    rig = Rig()
    reqs = []
    for n in [5, 17, 3, 40, 9, 26, 11]:
        toks = _seq(rng, n + 1)
        slots = rig.slots(n + 4)
        rig.prefill([(toks[:n], slots, 0)])
        reqs.append((toks[n], n, slots))
    alone = rig.decode([reqs[0]])[0]
    for others in ([1, 2], [3, 4, 5, 6], [6, 5, 4, 3, 2, 1], [1]):
        batch = [reqs[i] for i in others]
        at = rng.randrange(len(batch) + 1)
        batch.insert(at, reqs[0])
        assert torch.equal(rig.decode(batch)[at], alone), (others, at)


def test_prefill_logits_do_not_depend_on_batch():
    rng = random.Random(7)
    rig = Rig()
    a = _seq(rng, 13)
    sa = rig.slots(16)
    alone = rig.prefill([(a, sa, 0)])[0]
    for n_other in ([4], [30, 2], [7, 7, 7]):
        group = [(_seq(rng, n), rig.slots(n), 0) for n in n_other]
        group.insert(1, (a, sa, 0))
        assert torch.equal(rig.prefill(group)[1], alone)


def test_prefill_equals_decode_for_the_same_position():
    """A retracted request is recomputed by a prefill; its logits must equal the decode path's."""
    rng = random.Random(3)
    rig = Rig()
    toks = _seq(rng, 30)
    s1, s2 = rig.slots(32), rig.slots(32)
    rig.prefill([(toks[:20], s1, 0)])
    decoded = [rig.decode([(toks[p], p, s1)])[0] for p in range(20, 29)]
    full = rig.prefill([(toks[:29], s2, 0)])[0]
    assert torch.equal(decoded[-1], full)
    # and a prefill that extends a cached prefix (prefix cache hit) gives the same again
    s3 = rig.slots(32)
    s3[:16] = s2[:16]
    assert torch.equal(rig.prefill([(toks[:29], s3, 16)])[0], full)


def test_linear_runs_every_row_count_on_fixed_tiles():
    """Every row count 1..64 gives a row the bits it has alone, on both matmul paths (a small
    weight on F.linear, a large one packed for oneDNN): each call is one fixed-shape tile."""
    from harness.engine.invariance import _rows_agree
    from harness.engine.model import pack_weight
    torch.set_num_threads(1)
    m = Model.__new__(Model)
    g = torch.Generator().manual_seed(0)
    m.w = {"small": torch.randn(128, 64, generator=g), "large": torch.randn(1536, 576, generator=g)}
    m._packed = {}
    assert pack_weight(m.w["small"]) is None
    for name, w in m.w.items():
        x = torch.randn(64, w.shape[1], generator=g)
        assert _rows_agree(lambda t: m.linear(t, name), x, name) is None


@pytest.mark.parametrize("width", [200, 256, 1024])
def test_chunked_attention_is_batch_invariant_at_every_length(width, monkeypatch):
    """Attention reduces over each request's own length in chunks of KV_CHUNK: a request's logits
    are bitwise the same alone, in any batch (other lengths, other positions in the batch), at
    lengths on both sides of a chunk boundary and at every row width, and whatever upper bound on
    its length the caller gives."""
    rng = random.Random(width)
    rig = Rig(width, slots=8 * width + 1)
    C = KV_CHUNK
    lens = sorted({1, 2, C - 1, C, C + 1, 2 * C, 2 * C + 1, width // 2, min(width - 8, 300)})
    reqs = []
    for n in lens:
        toks = _seq(rng, n + 1)
        slots = rig.slots(n + 2)
        rig.prefill([(toks[:n], slots, 0)])
        reqs.append((toks[n], n, slots))
    alone = [rig.decode([r])[0] for r in reqs]
    for trial in range(6):
        pick = rng.sample(range(len(reqs)), rng.randint(2, len(reqs)))
        got = rig.decode([reqs[i] for i in pick])
        for j, i in enumerate(pick):
            assert torch.equal(got[j], alone[i]), (width, trial, lens[i], pick)
    # an upper bound on the keys (the whole row, as off the CPU without the host's lengths)
    # changes the cost, not the bits
    monkeypatch.setattr(Model, "_kv_len", staticmethod(lambda pos, groups, w, hint: [w] * len(groups)))
    got = rig.decode(reqs)
    assert all(torch.equal(got[i], alone[i]) for i in range(len(reqs)))


def test_prefill_and_decode_agree_across_chunk_boundaries():
    """Positions just before, at and after a chunk boundary, decoded one by one, equal the last
    row of a prefill over the same tokens (a fully masked chunk adds exact zeros)."""
    rng = random.Random(11)
    rig = Rig()
    C = KV_CHUNK
    toks = _seq(rng, 2 * C + 4)
    s1, s2 = rig.slots(2 * C + 8), rig.slots(2 * C + 8)
    start = C - 3
    rig.prefill([(toks[:start], s1, 0)])
    for p in range(start, 2 * C + 3):
        dec = rig.decode([(toks[p], p, s1)])[0]
        if p % C in (C - 2, C - 1, 0, 1):
            assert torch.equal(dec, rig.prefill([(toks[:p + 1], s2, 0)])[0]), p
