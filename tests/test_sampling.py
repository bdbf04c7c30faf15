import torch

from harness.engine.sampling import sample, uniform


def test_uniform_depends_only_on_seed_and_position():
    s = torch.tensor([1, 2, 1, 1]); p = torch.tensor([5, 5, 5, 6])
    u = uniform(s, p)
    assert u[0] == u[2] and u[0] != u[1] and u[0] != u[3]
    assert bool(((u >= 0) & (u < 1)).all())
    assert torch.equal(uniform(s[[2]], p[[2]]), u[[2]])


def test_greedy_and_seeded_sampling_are_batch_independent():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 50, generator=g)
    temp = torch.tensor([0.0, 1.0, 0.7, 1.3] * 2)
    top_p = torch.tensor([1.0, 0.9, 0.5, 1.0] * 2)
    seeds = torch.arange(8) * 17
    pos = torch.arange(8) + 3
    full = sample(logits, temp, top_p, seeds, pos)
    assert full[0] == logits[0].argmax()
    for i in range(8):
        one = sample(logits[i:i + 1], temp[i:i + 1], top_p[i:i + 1], seeds[i:i + 1], pos[i:i + 1])
        assert one[0] == full[i]


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(4000, 1)
    toks = sample(logits, torch.ones(4000), torch.ones(4000), torch.full((4000,), 9), torch.arange(4000))
    freq = torch.bincount(toks, minlength=3).float() / 4000
    assert abs(freq[0] - 0.7) < 0.04 and abs(freq[2] - 0.1) < 0.03
    # top-p 0.75 keeps only the first two tokens
    toks = sample(logits, torch.ones(4000), torch.full((4000,), 0.75), torch.full((4000,), 9), torch.arange(4000))
    assert int((toks == 2).sum()) == 0
