"""vLLM's path features two at a time (issue 44, item 2; harness/targets/vllm/combos.py): the plan
covers every pair, each row's mix turns its features on for its featured requests, and what met
is read from the agent's per-request counts (harness/agents/vllm/steps.py), never from the plan.
The real engine's run is tests/test_vllm_combos.py (scheduled tier)."""
import itertools
from types import SimpleNamespace as NS

from harness.agents.vllm import steps as vllm_steps
from harness.agents.vllm.steps import request_key
from harness.oracles import steps
from harness.targets.vllm import combos
from harness.workloads.covering import all_pairs


class Tok:
    def encode(self, text):
        return [32 + (ord(c) % 200) for c in text]


def test_the_plan_covers_every_pair_of_vllms_features():
    arr = combos.plan()
    covered = set().union(*(set(combos.met({f for f, v in row.items() if v})) for row in arr.rows))
    every = set(itertools.combinations(combos.FEATURES, 2))
    exclusive = {p for p in every if frozenset(p) in combos.EXCLUSIVE}
    # vLLM refuses prompt logprobs on a stream, and reads no cached prefix for a request that asks for them
    assert exclusive == {("abort", "prompt_logprobs"), ("prefix_hit", "prompt_logprobs")}
    assert covered == every - exclusive  # every other pair on together somewhere
    never = {(("abort", True), ("prompt_logprobs", True)), (("prefix_hit", True), ("prompt_logprobs", True))}
    assert arr.covers() == all_pairs({f: (False, True) for f in combos.FEATURES}) - never  # every other value pair
    assert set(arr.impossible) == never and len(arr.rows) <= 10
    # abort x prefix_hit has a row of its own, which no other planned pair shares: a leak only there is
    # named by that pair alone
    failing = [i for i, r in enumerate(arr.rows) if r["abort"] and r["prefix_hit"]]
    assert combos.suspects(arr, failing, [i for i in range(len(arr.rows)) if i not in failing]) == [
        ("abort", "prefix_hit")]


def test_a_feature_whose_path_row_is_absent_leaves_the_plan():
    """Each feature names the path rows it takes (a release, runner or configuration without them drops
    it, equivalence/test_path_pairs.py); the plan over the rest still covers their pairs."""
    from harness.targets.vllm import paths as vp
    assert set(combos.PATH_ROWS) == set(combos.FEATURES)
    assert all(r in vp.PATHS_BY_NAME for rows in combos.PATH_ROWS.values() for r in rows)
    rest = tuple(f for f in combos.FEATURES if f != "prefix_hit")
    arr = combos.plan(rest)
    assert arr.factors == rest and all("prefix_hit" not in row for row in arr.rows)
    assert set(arr.impossible) == {(("abort", True), ("prompt_logprobs", True))}


def test_a_row_turns_its_features_on_for_its_featured_requests():
    arr = combos.plan()
    i, row = next((i, r) for i, r in enumerate(arr.rows) if r["abort"] and r["prefix_hit"])
    reqs, controls = combos.mix(Tok(), row, i)
    warm, featured = reqs[0], reqs[1:]
    assert warm.rid == f"r{i}w" and len(featured) == combos.FEATURED
    for r in featured:
        assert r.prompt_ids[:40] == warm.prompt_ids[:40] and r.arrival > 0 and r.abort_after == combos.ABORT_AFTER
        assert bool(r.extra.get("structured_outputs")) == row["structured_output"]
        assert (r.temperature > 0) == row["seed"]
    assert bool(controls) == row["preempt_in_flight"]
    j, plain = next((j, r) for j, r in enumerate(arr.rows) if not r["prefix_hit"] and not r["chunked_prefill"])
    reqs, _ = combos.mix(Tok(), plain, j)
    assert all(r.rid.startswith(f"r{j}c") and len(r.prompt_ids) <= 12 for r in reqs)  # no warm-up, one step each


def test_what_met_is_read_from_the_agents_counts():
    """The agent counts a prefix hit and a chunked prefill at a request's first step, a preemption
    with a step in flight at the preemption; the answer says what the request produced."""
    books = vllm_steps.Books(lambda role: NS(set=lambda **kw: None))
    hit = NS(request_id="h", prompt_token_ids=list(range(100)), max_tokens=8, num_computed_tokens=96, num_tokens=100,
             num_output_placeholders=0, num_output_tokens=0, status=None, num_preemptions=0)
    sched = NS(requests={"h": hit}, running=[hit], waiting=[], max_num_scheduled_tokens=64)
    books.after_schedule(sched, NS(num_scheduled_tokens={"h": 32}, total_num_scheduled_tokens=32))
    rec = books.reqs["h"]
    assert rec[7] == {"prefix_hit": 1, "prefill_chunk": 1}  # 64 cached, 32 computed, 4 left for the next step
    hit.num_stale_output_tokens, hit.drop_stale_output = 1, False
    books.preempted(hit)  # a step of it in flight, its output delivered (the KV-pressure path)
    assert rec[7]["preempted_in_flight"] == 1
    r = combos.Request("r0c0", list(range(100)), max_new_tokens=8)
    r.extra = {"prompt_logprobs": 1}
    sb = steps.summed({"h": dict(zip(vllm_steps.FIELDS, rec))})
    assert request_key(r.prompt_ids, 8) in sb.evidence
    assert combos.observed(r, sb, [5, 6]) == {"prefix_hit", "chunked_prefill", "preempt_in_flight", "prompt_logprobs"}
    assert combos.observed(r, sb, []) == {"prefix_hit", "chunked_prefill", "preempt_in_flight"}  # no answer


def test_a_books_finding_is_named_by_the_pairs_only_failing_rows_turn_on():
    arr = combos.plan()
    failing = [i for i, r in enumerate(arr.rows) if r["abort"] and r["prefix_hit"]]
    clean = [i for i in range(len(arr.rows)) if i not in failing]
    assert ("abort", "prefix_hit") in combos.suspects(arr, failing, clean)
    assert combos.pair_name(("abort", "prefix_hit")) == "abort x prefix_hit"


def _suite_with_rows(monkeypatch, row_result):
    """equivalence/test_path_pairs.py's case over a stand-in target whose rows `row_result(i)` gives
    (no engine): its verdict exception."""
    import pytest

    from equivalence import test_path_pairs as suite
    from harness.verdict import outcome
    monkeypatch.setattr(suite, "run_row", lambda target, tok, row, i: ([], row_result(i)))
    target = NS(name="vllm", paths=True, row_absent=lambda row: "", servers={})
    with pytest.raises(BaseException) as e:  # a verdict: pytest's skip, xfail or failure
        suite.test_pairs_meet_and_books_come_back(target, Tok(), lambda *a: None)
    return outcome.verdict_of(e.value), str(e.value)


def test_a_row_a_known_crash_ended_is_that_entrys_not_a_books_finding(monkeypatch):
    """The 0.13.0 sweep: the known prompt-logprobs crash killed the async-on engine in one row and
    the case failed as `books.leak`. A known death is KNOWN UPSTREAM with its entry (the pairs
    left unmet since named); a death no entry knows, or a leak, still fails the case."""
    from equivalence.test_path_pairs import Lost
    from harness.verdict import Status
    clean = {False: (steps.StepBooks(), {}, {}), True: (steps.StepBooks(), {}, {})}
    died = {**clean, True: Lost("async on: CRASH (KNOWN UPSTREAM kid): assert", "kid")}
    verdict, text = _suite_with_rows(monkeypatch, lambda i: died if i == 2 else clean)
    assert verdict[0] == Status.KNOWN and verdict[2] == "kid", (verdict, text)
    assert "(rows [2] of" in text and "not exercised since" in text, text  # nothing met here: every pair unmet
    lost = {**clean, True: Lost("async on: CRASH: KeyError")}
    verdict, text = _suite_with_rows(monkeypatch, lambda i: lost if i == 2 else died if i == 3 else clean)
    assert verdict[0] == Status.FAIL and verdict[1] == "books.leak" and "KeyError" in text, (verdict, text)
