"""Admission by what can run (issue 44, item 3), against real vLLM in the two-seqs configuration
(--max-num-seqs 2), with many max_tokens 1 and 2 requests sent at once.

Under async scheduling a request whose last token is in flight stays in vLLM's `running` until
that token lands, and the async guard at max_tokens will not schedule it again: it holds a slot
that nothing can use, and vLLM's admission (`len(running) >= max_num_seqs`) counts it
(vllm-project/vllm#45257, open; the fix vllm-project/vllm#45339 was closed unmerged). The agent
counts such a slot as free (harness.agents.vllm.steps.done_waiting), so a newcomer left waiting
behind it is an admission wait, and the steps oracle judges the arms with one schedule of slack
async on (harness.oracles.steps.ADMISSION_SLACK).

Stock 0.32.0 holds each newcomer one schedule behind such slots: inside the slack, quiet (the
figures print). The source patch finished_slot_held_a_schedule holds it one schedule more (a slot
freed by a finish counted until the next schedule): caught as `admission.starved`, where the old
count (a slot free only when len(running) < max_num_seqs, and no count on a schedule that ran
nothing) saw at most one wait per request and stayed quiet.

Its own pair (two-seqs), so in the scheduled tier: .ci/run's fast representative of the
admission count is tests/test_steps_oracle.py::test_a_slot_held_by_a_request_that_only_waits_for_its_last_token_is_free."""
import time

import pytest

from harness.agents import plan as planmod
from harness.oracles import steps
from harness.targets.vllm import workload as vllm_workload
from harness.verdict import code_of
from tests.served_pair import own_vllm_pairs  # noqa: F401 (the module's `pairs` fixture)

pytestmark = [pytest.mark.vllm, pytest.mark.own_servers, pytest.mark.scheduled, pytest.mark.slow]
PATCH = "finished_slot_held_a_schedule"
CONFIG = "two-seqs"
N = 16


def _workload(tok):
    words = "slot table relay fence window step stream token prefix cache batch entry row page copy wait".split()
    return [vllm_workload.path_request(f"m{i}", tok.encode(" ".join(words[i:] + words[:i])[:40]), 1 + i % 2,
                                       ["max_tokens_1_2"], ignore_eos=True) for i in range(N)]


def _run(target, reqs, overlap):
    target.url(overlap)  # a server on other source patches restarts before its books are read
    before = steps.books_of(planmod.read_facts(str(target.facts_dir(overlap))))
    t0 = time.monotonic()
    run = target.run(reqs, overlap=overlap)
    secs = time.monotonic() - t0
    time.sleep(0.4)  # the agent flushes its facts every 0.1 s
    books = steps.summed(steps.new_since(before, steps.books_of(planmod.read_facts(str(target.facts_dir(overlap))))))
    return run, books, secs


def figures(books) -> dict:
    per = [v.admit_waits for v in books.per_key.values()]
    return {"admit_waits": sum(per), "requests_waited": sum(1 for n in per if n), "max_per_request": max(per or [0]),
            "scheduled": sum(v.scheduled for v in books.per_key.values())}


def test_admission_behind_slots_only_in_flight_tokens_hold(pairs):
    t = pairs.get("vllm", config=CONFIG)
    reqs = _workload(t.tokenizer())
    _, off, s_off = _run(t, reqs, False)
    _, on, s_on = _run(t, reqs, True)
    quiet = steps.compare(reqs, off, on)
    print(f"stock {t.version} {CONFIG}: off {figures(off)} in {s_off:.1f} s; on {figures(on)} in {s_on:.1f} s")
    assert not [f for f in quiet.findings if code_of(f) == "admission.starved"], quiet.findings
    t = pairs.get("vllm", {PATCH}, config=CONFIG)
    _, bad, s_bad = _run(t, reqs, True)
    caught = steps.compare(reqs, off, bad)
    print(f"patched {PATCH}: on {figures(bad)} in {s_bad:.1f} s")
    assert any(code_of(f) == "admission.starved" for f in caught.findings), (caught.findings, figures(bad))
