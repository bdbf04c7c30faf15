"""harness.oracles.acceptance: the oracle drafter's accept-length distribution and band, per-request
comparison; quiet on the correct engine, and `verify_wastes_last_draft` (tokens right) caught."""
import pytest

from harness.oracles.acceptance import band, band_problem, oracle_distribution, per_request_problems
from harness.targets.ref import RefTarget
from equivalence.test_spec_acceptance import K, WRONG, _workload


def test_distribution_and_band():
    d = oracle_distribution(3, 0.2)
    assert sum(d) == pytest.approx(1.0) and d[-1] == pytest.approx(0.8 ** 3)
    lo, mean, hi = band(3, 0.2, 100)
    assert mean == pytest.approx(1 + 0.8 + 0.64 + 0.512) and lo < mean < hi
    assert band(3, 0.2, 400)[2] - band(3, 0.2, 400)[0] == pytest.approx((hi - lo) / 2)
    assert band_problem([4] * 100, 3, 0.2) and band_problem([2] * 10, 3, 0.2) is None  # too few to judge
    assert per_request_problems({"a": [1, 2]}, {"a": [1, 2]}) == []
    assert "from window 1" in per_request_problems({"a": [1, 3]}, {"a": [1, 2]})[0]


@pytest.mark.parametrize("faults", [frozenset(), frozenset({"verify_wastes_last_draft"})], ids=["correct", "fault"])
def test_oracle_drafter_band(faults):
    t = RefTarget(faults=faults)
    ref = RefTarget()
    reqs = _workload(t.tokenizer(), 0, 24)
    kw = dict(max_running=24, spec="oracle", spec_k=K, spec_wrong=WRONG)
    on = t.run(reqs, overlap=True, **kw)
    assert on.outputs == ref.run(reqs, overlap=False, **kw).outputs  # the tokens cannot tell
    why = band_problem(on.engine.spec.accept_lens, K, WRONG)
    assert (why is None) == (not faults), why
    if faults:
        assert "drafts are wasted" in why


def test_mtp_prefix_pages_are_shared_only_with_the_same_next_token():
    """Found by the acceptance oracle (seed 28): the draft head's KV at a position depends on the
    next token, so a prompt page cached by a request whose prompt continued differently gave the
    other request stale draft KV (tokens right, drafts wasted, accept lengths on != off)."""
    from harness.engine.memory import KVPool, PrefixCache
    from harness.oracles.acceptance import per_request_problems
    cache = PrefixCache(KVPool(64, 2), lookahead=1)
    nodes, _ = cache.insert([1, 2, 3, 4, 5], [1, 2, 3], 0)
    assert len(nodes) == 2  # pages [1, 2] and [3, 4]: each needs the token after it
    assert len(cache.match([1, 2, 3, 4, 5, 6])) == 2 and len(cache.match([1, 2, 3, 9, 9])) == 1
    t = RefTarget()
    reqs = _workload(t.tokenizer(), 28, 8)
    kw = dict(max_running=24, spec="mtp", spec_k=K, spec_wrong=WRONG)
    off, on = t.run(reqs, overlap=False, **kw), t.run(reqs, overlap=True, **kw)
    assert per_request_problems(on.engine.spec.accept_by_rid, off.engine.spec.accept_by_rid) == []
