"""Speculative acceptance (issue 10, item 7): per request, the accept lengths with overlap on
equal those with overlap off, window for window, for every drafter; and the oracle drafter's
mean accept length lies in the band its wrong-token probability implies (harness.oracles.acceptance).
Tokens cannot show a verify that wastes drafts: they stay right, only fewer come per step."""
import random

import pytest

from harness.workloads import strategies, presets as workloads
from harness.oracles.acceptance import band_problem, per_request_problems
from harness.engine.request import Request
from harness.oracles.reference import batch_invariant

K, WRONG = 4, 0.1  # (1 - WRONG) ** K = 66% of windows accept every draft: a wasted draft shows


def _workload(tok, seed: int, n: int):
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        words = " ".join(rng.choice(workloads.WORDS) for _ in range(rng.randint(2, 8)))
        r = Request(f"a{i}", [tok.bos_id] + tok.encode(words), max_new_tokens=rng.randint(40, 64))
        if i % 4 == 3:  # seeded sampling: the oracle's draft is the target's own sample
            r.temperature, r.top_p, r.seed = 0.8, 0.95, rng.randrange(1 << 30)
        reqs.append(r)
    return reqs


@pytest.mark.parametrize("drafter", ["oracle", "mtp", "ngram"])
def test_accept_lengths(target, tok, oh_options, drafter):
    if not getattr(target, "white_box", False):
        pytest.skip(f"accept lengths per window need a white-box target; {target.name} hides them")
    if drafter not in strategies.drafters():
        pytest.skip(f"the engine offers no {drafter} drafter for this model")
    for seed in range(oh_options.seeds or 1):
        # the band needs many windows; the on/off comparison of the other drafters needs fewer
        reqs = _workload(tok, seed, 24 if drafter == "oracle" else 8)
        kw = dict(max_running=24, spec=drafter, spec_k=K, spec_wrong=WRONG)
        off = target.run(reqs, overlap=False, **kw)
        on = target.run(reqs, overlap=True, **kw)
        acc_on, acc_off = on.engine.spec.accept_by_rid, off.engine.spec.accept_by_rid
        if not batch_invariant(target):  # rounding may move a token at a tie (the equivalence suite
            # judges those): compare the requests whose tokens agree
            same = {o[0] for o, f in zip(sorted(on.outputs), sorted(off.outputs)) if o == f}
            acc_on = {r: a for r, a in acc_on.items() if r in same}
            acc_off = {r: a for r, a in acc_off.items() if r in same}
        diff = per_request_problems(acc_on, acc_off)
        assert not diff, f"seed {seed}, {drafter}: accept lengths differ with overlap on; first: {diff[0]}"
        if drafter == "oracle":
            for label, run in (("overlap on", on), ("overlap off", off)):
                why = band_problem(run.engine.spec.accept_lens, K, WRONG)
                assert why is None, f"seed {seed}, {label}: {why}"
