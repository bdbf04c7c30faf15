"""SGLang 0.5.23 with its NGRAM drafter, overlap on and off (`check --target sglang --configs ngram`'s
pair, our CPU path supplying what a CPU build lacks): stock quiet on every speculative judgement of
the agent (harness/agents/sglang/spec.py) with each one's path counted, and each re-created
speculative bug (harness/agents/sglang/spec_patches.py) caught by the judgement of its class.

Scheduled tier (each test starts an NGRAM pair, and each patch restarts its overlap-on server);
.ci/run's representative: the same judgements on batches made as NGRAM leaves them, quiet and each
caught (tests/test_sglang_spec_books.py)."""
import time

import pytest

from harness.oracles.reference import divergences
from tests.served_pair import pair_fixtures

pytestmark = [pytest.mark.slow, pytest.mark.sglang, pytest.mark.scheduled]

sglang_pair, sglang, tok = pair_fixtures("sglang", "module", config="ngram")

# every judgement of the agent's speculative books: its violation counter and the path it needs run
JUDGEMENTS = {"spec_past_reservation": "path_spec_reservation", "spec_bonus_wrong": "path_spec_bonus_batched",
              "spec_relay_len_wrong": "path_spec_relay_len", "spec_relay_tokens_wrong": "path_spec_relay_tokens",
              "spec_window_slots_wrong": "path_spec_window_slots"}


def _workload(tok):
    """Six greedy requests at once, twice (a batch over one; repetitive prompts, so the n-gram trie
    finds drafts and some are accepted, the rest rejected)."""
    from harness.targets.vllm.workload import path_request, token_ids
    texts = ["1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "The cat sat on the mat. The cat sat on the mat. The cat",
             "def add(a, b):\n    return a + b\n\ndef add(a, b):\n", "Monday, Tuesday, Wednesday, Thursday,",
             "a b c d e f g h i j k", "Hello! Hello! Hello! Hello!"]
    reqs = []
    for rnd in range(2):
        for i, text in enumerate(texts):
            r = path_request(f"r{rnd}s{i}", token_ids(tok, text), 48, [], arrival=rnd * 30)
            r.temperature = 0.0
            reqs.append(r)
    return reqs


def _counts(t, reqs, overlap):
    from harness.agents import plan as planmod
    from harness.targets.sglang import paths as sp
    t.url(overlap)  # a server on other source patches restarts now: the counts are the new one's
    before = sp.counts(planmod.read_facts(str(t.facts_dir(overlap))))
    run = t.run(reqs, overlap=overlap)
    time.sleep(0.3)  # the agent flushes its counters every 0.1 s
    facts = planmod.read_facts(str(t.facts_dir(overlap)))
    firsts = {k: v for f in facts for k, v in f.items() if k.startswith("first_spec_") and v}
    return run, sp.delta(before, sp.counts(facts)), firsts


def test_stock_ngram_is_quiet_on_every_judgement(sglang, tok):
    reqs = _workload(tok)
    runs, counts = {}, {}
    for ov in (True, False):
        runs[ov], counts[ov], firsts = _counts(sglang, reqs, ov)
        for bad, path in JUDGEMENTS.items():
            if path == "path_spec_relay_tokens" and not ov:
                continue  # overlap off: nothing is spliced from the relay
            assert counts[ov].get(path, 0) > 0, f"not exercised: {path} (overlap {ov}): {counts[ov]}"
            assert counts[ov].get(bad, 0) == 0, (bad, firsts)
    assert counts[True].get("path_spec_second_window", 0) > 0  # the lagging count: the case two windows exist for
    clear = [d for _, _, divs in divergences(runs[False], runs[True]) for d in divs if not d.near_tie]
    assert not clear, clear[0].describe(tok.decode)


@pytest.mark.parametrize("patch,caught_by", [
    ("sglang_spec_reservation_one_window", ("spec_past_reservation", "spec_window_slots_wrong")),
    ("sglang_spec_bonus_stride", ("spec_bonus_wrong",)),
])
def test_each_spec_patch_is_caught_by_its_judgement(sglang, tok, patch, caught_by, oh_pairs):
    """The patch on the overlap-on server only (where the bug lived), the same workload: the agent's
    judgement of its class fires; which other judgements fire is printed, not required."""
    reqs = _workload(tok)
    t = oh_pairs.get("sglang", {patch}, config="ngram")
    try:
        _, counts, firsts = _counts(t, reqs, True)
    finally:
        oh_pairs.get("sglang", (), config="ngram")
    print(patch, {k: counts.get(k, 0) for k in JUDGEMENTS}, firsts)
    for bad in caught_by:
        assert counts.get(bad, 0) > 0, f"{patch} went unnoticed by {bad}: {counts}"
