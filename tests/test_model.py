"""Batch invariance: a request's logits are bitwise identical whatever else is in the batch,
and whether its cache was filled by a prefill or by decode steps (retraction recomputes)."""
import random

import pytest
import torch

from harness.engine.build import load_model
from harness.engine.model import Model, pad_rows

L = 256


class Rig:
    def __init__(self):
        cfg, w, _ = load_model("tiny")
        self.cfg, self.m = cfg, Model(cfg, w, torch.device("cpu"))
        self.k = [torch.zeros(4096, cfg.kv_heads, cfg.head_dim) for _ in range(cfg.layers)]
        self.v = [torch.zeros(4096, cfg.kv_heads, cfg.head_dim) for _ in range(cfg.layers)]
        self.next_slot = 1

    def slots(self, n):
        s = list(range(self.next_slot, self.next_slot + n))
        self.next_slot += n
        return s

    def prefill(self, reqs):
        """reqs: list of (tokens, slots, start): compute tokens[start:] with cache slots[:start] present."""
        ids, pos, loc, groups, kvidx = [], [], [], [], torch.zeros(len(reqs), L, dtype=torch.long)
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
        kvidx = torch.zeros(N, L, dtype=torch.long)
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


def test_rows_must_be_padded_to_four():
    """The reason for pad_rows: on this CPU a 1-row matmul differs from the same row in a 4-row one."""
    x, w = torch.randn(8, 64), torch.randn(128, 64)
    assert torch.equal((x[:4] @ w.T)[0], (x @ w.T)[0])
    assert pad_rows(1) == 4 and pad_rows(5) == 8 and pad_rows(8) == 8
