"""The steps oracle without vLLM: the agent's books (harness.agents.vllm.steps) fed the
scheduler's own shapes step by step, and the comparison of the arms (harness.oracles.steps):
a step past max_tokens and a wait with budget free are caught, the async guard's legitimate
sit-out after a request's last token is not, and preempted or aborted requests are left out.
The live proof (a vLLM source patch caught by this oracle and not by tokens) is in
tests/test_vllm.py."""
from types import SimpleNamespace as NS

import pytest

from equivalence.path_judge import judge_steps
from harness.agents.vllm.steps import Books, request_key
from harness.oracles import steps
from harness.targets.vllm import paths as vp
from harness.targets.vllm import workload as vllm_workload
from harness.targets.base import Run


class _Facts:
    def __init__(self):
        self.data = {}

    def set(self, **kw):
        self.data.update(kw)


def _sched(reqs, budget=64):
    return NS(requests={r.request_id: r for r in reqs}, running=list(reqs), max_num_scheduled_tokens=budget)


def _req(rid, prompt=(1, 2, 3), max_tokens=2):
    return NS(request_id=rid, prompt_token_ids=list(prompt), max_tokens=max_tokens, num_computed_tokens=0,
              num_tokens=len(prompt), status=None)


def _step(books, sched, run: dict):
    """One schedule: `run` maps request id -> tokens; computed tokens advance as vLLM's do."""
    for rid, n in run.items():
        r = sched.requests[rid]
        r.num_computed_tokens += n
    books.after_schedule(sched, NS(num_scheduled_tokens=run, total_num_scheduled_tokens=sum(run.values())))
    for rid in run:  # the sampled token becomes known (sync) before the next schedule
        r = sched.requests[rid]
        if r.num_computed_tokens >= r.num_tokens:
            r.num_tokens += 1


def _books():
    f = _Facts()
    return Books(lambda role: f), f


def test_books_count_scheduled_sampled_and_a_wait_once_the_request_runs_again():
    books, facts = _books()
    a, b = _req("a"), _req("b", (4, 5, 6, 7), max_tokens=4)
    s = _sched([a, b])
    _step(books, s, {"a": 3, "b": 4})  # prefills: both sample
    _step(books, s, {"b": 1})  # a sits out with budget free ...
    _step(books, s, {"a": 1, "b": 1})  # ... and runs again: one wait
    rec = facts.data["requests"]
    a_rec, b_rec = steps.StepRecord.of(rec["a"]), steps.StepRecord.of(rec["b"])  # written with names
    assert isinstance(rec["a"], dict) and (a_rec.key, a_rec.scheduled, a_rec.sampled, a_rec.waited) == (
        request_key([1, 2, 3], 2), 2, 2, 1)
    assert (b_rec.scheduled, b_rec.sampled, b_rec.waited) == (3, 3, 0)


def test_sitting_out_the_step_after_the_last_token_and_finishing_is_no_wait():
    books, facts = _books()
    a, b = _req("a"), _req("b", (4, 5), max_tokens=8)
    s = _sched([a, b])
    _step(books, s, {"a": 3, "b": 2})
    _step(books, s, {"b": 1})  # a's last token is in flight: the async guard skips it
    a.status = NS(name="FINISHED_LENGTH_CAPPED")
    books.finished(a)
    s.running.remove(a)
    assert facts.data["requests"]["a"]["finish"] == "FINISHED_LENGTH_CAPPED"  # published at once: the burst's last may end here
    _step(books, s, {"b": 1})
    assert facts.data["requests"]["a"]["waited"] == 0


def test_a_full_step_or_an_empty_one_is_no_wait():
    books, facts = _books()
    a, b = _req("a", max_tokens=4), _req("b", max_tokens=4)
    s = _sched([a, b], budget=3)
    _step(books, s, {"a": 3})  # the budget went to a: b was not left waiting with budget free
    _step(books, s, {})  # paused: nothing scheduled, no step
    _step(books, s, {"a": 1, "b": 2})
    assert facts.data["requests"]["b"]["waited"] == 0


def _arm(**per_key):
    """key -> (copies, scheduled, sampled, waited, preempted, finish)."""
    b = steps.StepBooks()
    for key, (n, sc, sa, w, p, fin) in per_key.items():
        b.per_key[key] = steps.Sums(copies=n, scheduled=sc, sampled=sa, waited=w, preempted=p)
        b.finish[key] = {fin}
    return b


REQS = [vllm_workload.path_request("t0", [1, 2], 2, ["max_tokens_1_2"]), vllm_workload.path_request("st0", [3, 4], 40, ["stop"])]
K0, K1 = request_key([1, 2], 2), request_key([3, 4], 40)
L, S = "FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED"


def test_the_quiet_half_equal_steps_pass_and_a_stop_token_may_cost_one_step():
    off = _arm(**{K0: (1, 2, 2, 0, 0, L), K1: (1, 9, 9, 0, 0, S)})
    on = _arm(**{K0: (1, 2, 2, 0, 0, L), K1: (1, 10, 10, 0, 0, S)})
    v = steps.compare(REQS, off, on)
    assert v.findings == [] and v.compared == 2 and v.length_capped == 1


def test_a_step_past_max_tokens_is_caught():
    off = _arm(**{K0: (1, 2, 2, 0, 0, L)})
    on = _arm(**{K0: (1, 3, 3, 0, 0, L)})
    v = steps.compare(REQS, off, on)
    assert v.findings == ["request t0: 3 sampling steps async on, 2 off (max_tokens 2, capped in both): "
                          "1 step(s) past max_tokens"]


def test_a_wait_with_budget_free_is_caught():
    off = _arm(**{K0: (1, 2, 2, 0, 0, L)})
    on = _arm(**{K0: (1, 2, 2, 1, 0, L)})
    assert "waited 1 step(s) with budget free async on, 0 off" in steps.compare(REQS, off, on).findings[0]


def test_preempted_and_aborted_requests_are_left_out_and_counted():
    off = _arm(**{K0: (1, 2, 2, 0, 1, L), K1: (1, 3, 3, 0, 0, "FINISHED_ABORTED")})
    on = _arm(**{K0: (1, 5, 5, 3, 0, L), K1: (1, 9, 9, 2, 0, "FINISHED_ABORTED")})
    v = steps.compare(REQS, off, on)
    assert v.findings == [] and v.compared == 0
    assert v.left_out == {"preempted": 1, "aborted or unfinished": 1}


def _path_run(on_rec):
    off = {"r1": [K0, 2, 2, 0, 0, 0, L]}
    return vp.PathRun(REQS[:1], Run([]), Run([]), {}, {}, release="0.32.0", steps={False: off, True: {"r2": on_rec}})


def test_judge_steps_fails_a_step_past_max_tokens_and_passes_the_correct_engine():
    judge_steps(_path_run([K0, 2, 2, 0, 0, 0, L]), known=[])
    with pytest.raises(pytest.fail.Exception, match="steps: request t0: 3 sampling steps async on, 2 off"):
        judge_steps(_path_run([K0, 3, 3, 0, 0, 0, L]), known=[])


def test_the_step_past_max_tokens_is_known_upstream_only_before_its_fix():
    # the agent counted the entry's mechanism for that request: a step scheduled with its last token in flight
    run = _path_run([K0, 3, 3, 0, 0, 0, L, {"scheduled_at_cap": 1}])
    run.release = "0.11.0"
    with pytest.raises(pytest.xfail.Exception, match="KNOWN UPSTREAM async-step-past-max-tokens"):
        judge_steps(run)
    run.release = "0.12.0"
    with pytest.raises(pytest.fail.Exception, match="not live in 0.12.0"):
        judge_steps(run)


def test_a_step_past_max_tokens_without_the_known_mechanism_is_new():
    # in the entry's range, but no step of that request was scheduled with its last token in
    # flight (an older agent's record has no evidence at all): the same finding is new (issue 36)
    for rec in ([K0, 3, 3, 0, 0, 0, L, {"stale_dropped:reset": 1}], [K0, 3, 3, 0, 0, 0, L]):
        run = _path_run(rec)
        run.release = "0.11.0"
        with pytest.raises(pytest.fail.Exception, match="looks like known upstream async-step-past-max-tokens, "
                                                        r"but its mechanism \(scheduled_at_cap\) was not counted"):
            judge_steps(run)


def test_no_books_or_no_capped_request_is_not_exercised():
    run = _path_run([K0, 2, 2, 0, 0, 0, L])
    run.steps = {}
    with pytest.raises(pytest.fail.Exception, match="not exercised: steps"):
        judge_steps(run, known=[])
    run = _path_run([K0, 2, 2, 0, 0, 0, S])
    run.steps[False]["r1"][6] = S
    with pytest.raises(pytest.fail.Exception, match="no request capped by max_tokens"):
        judge_steps(run, known=[])


# -- issue 36: aborted requests get no work; admission is a result -------------------------------------
def _arm7(**recs):
    """An arm's summed books from full records: key -> (scheduled, sampled, waited, preempted, finish,
    after_abort, admit_waits)."""
    out = {}
    for i, (key, (sch, smp, wt, pre, fin, ab, adm)) in enumerate(recs.items()):
        out[f"r{i}"] = [key, sch, smp, wt, 0, pre, fin, {}, ab, adm]
    return steps.summed(out)


def test_a_step_after_the_abort_is_a_finding_in_either_arm():
    quiet = steps.compare(REQS, _arm7(**{K0: (2, 2, 0, 0, "FINISHED_ABORTED", 0, 0)}),
                          _arm7(**{K0: (2, 2, 0, 0, "FINISHED_ABORTED", 0, 0)}))
    assert quiet.findings == []
    on = _arm7(**{K0: (6, 6, 0, 0, L, 4, 0)})  # the abort ignored: it decoded on to max_tokens
    got = steps.compare(REQS, _arm7(**{K0: (2, 2, 0, 0, "FINISHED_ABORTED", 0, 0)}), on).findings
    assert got == ["request t0: 4 step(s) scheduled after its abort reached the scheduler (async on): an aborted "
                   "request gets no more work"], got
    off = _arm7(**{K0: (3, 3, 0, 0, "FINISHED_ABORTED", 1, 0)})
    assert "(async off)" in steps.compare(REQS, off, _arm7(**{K0: (2, 2, 0, 0, "FINISHED_ABORTED", 0, 0)})).findings[0]


def test_a_request_left_waiting_with_room_where_the_off_arm_admitted_it_is_a_finding():
    off = _arm7(**{K0: (2, 2, 0, 0, L, 0, 0)})
    assert steps.compare(REQS, off, _arm7(**{K0: (2, 2, 0, 0, L, 0, 0)})).findings == []
    # one schedule more async on is the queued step a newcomer cannot join (ADMISSION_SLACK)
    assert steps.compare(REQS, off, _arm7(**{K0: (2, 2, 0, 0, L, 0, 1)})).findings == []
    got = steps.compare(REQS, off, _arm7(**{K0: (2, 2, 0, 0, L, 0, 5)})).findings
    assert got == ["request t0: left waiting 5 step(s) with a slot, token budget and KV blocks free async on, 0 off "
                   "(the async-off arm admitted it sooner; one step more is allowed, the queued step it cannot "
                   "join)"], got
    assert steps.compare(REQS, off, _arm7(**{K0: (2, 2, 0, 0, L, 0, 2)})).findings  # two is one too many
    # waiting as long as the off arm did (room counted the same in both) is no finding
    assert steps.compare(REQS, _arm7(**{K0: (2, 2, 0, 0, L, 0, 2)}), _arm7(**{K0: (2, 2, 0, 0, L, 0, 2)})).findings == []
    # nor is a request the oracle leaves out (preempted, aborted): its admission is not comparable
    assert steps.compare(REQS, off, _arm7(**{K0: (2, 2, 0, 1, L, 0, 9)})).findings == []


def test_the_agent_counts_steps_after_an_abort_and_admission_waits_with_room():
    from harness.agents.vllm import steps as vllm_steps
    books, facts = _books()
    vllm_steps._BOOKS = books
    a, w = _req("a", max_tokens=8), _req("w", (7, 8))
    w.status, w.num_preemptions = NS(name="WAITING"), 0
    pool = NS(get_num_free_blocks=lambda: 10)
    s = NS(requests={"a": a, "w": w}, running=[a], waiting=[w], max_num_scheduled_tokens=64, max_num_active_reqs=4,
           kv_cache_manager=NS(block_pool=pool), block_size=16, _pause_state=NS(name="UNPAUSED"))
    _step(books, s, {"a": 3})  # w waits with a slot, budget and blocks free
    assert facts.data["requests"]["w"]["admit_waits"] == 1
    pool.get_num_free_blocks = lambda: 0  # no block for its prompt: a legitimate wait, not counted
    _step(books, s, {"a": 1})
    s.running = [a, a, a, a]  # no slot: not counted either
    pool.get_num_free_blocks = lambda: 10
    _step(books, s, {"a": 1})
    assert facts.data["requests"]["w"]["admit_waits"] == 1
    s.running = [a]
    # the abort reaches the scheduler; a scheduler that ignores it schedules the request again
    vllm_steps._finish(lambda self, ids, status: [])(s, ["a"], NS(name="FINISHED_ABORTED"))
    _step(books, s, {"a": 1})
    _step(books, s, {"a": 1})
    assert facts.data["requests"]["a"]["after_abort"] == 2


def test_admission_is_counted_as_vllm_walks_its_queue():
    """vLLM admits from the head of its waiting queue and stops at the first request whose blocks do
    not fit: a newcomer behind a preempted request that cannot resume yet waits by design (a stock
    stress case under KV pressure was counted 30 and 42 waits before the walk). Requests ahead take
    their blocks, slot and budget first; a request blocked on a grammar is skipped, as vLLM does."""
    from harness.agents.vllm import steps as vllm_steps
    books, facts = _books()
    vllm_steps._BOOKS = books
    a = _req("a", max_tokens=8)
    head, new = _req("p", tuple(range(40))), _req("w", (7, 8))  # p: 41 tokens, 3 blocks of 16
    head.status, head.num_preemptions = NS(name="PREEMPTED"), 1
    new.status, new.num_preemptions = NS(name="WAITING"), 0
    pool = NS(get_num_free_blocks=lambda: 2)
    s = NS(requests={"a": a, "p": head, "w": new}, running=[a], waiting=[head, new], max_num_scheduled_tokens=64,
           max_num_active_reqs=4, kv_cache_manager=NS(block_pool=pool), block_size=16, _pause_state=NS(name="UNPAUSED"))
    _step(books, s, {"a": 3})  # the preempted head needs 3 blocks of 2: w behind it is not counted
    assert facts.data["requests"].get("w", [0] * 10)[9] == 0
    pool.get_num_free_blocks = lambda: 3  # the head fits, and takes them all: still no room for w
    _step(books, s, {"a": 1})
    assert facts.data["requests"].get("w", [0] * 10)[9] == 0
    pool.get_num_free_blocks = lambda: 4  # room for both: w was left waiting with room
    _step(books, s, {"a": 1})
    assert facts.data["requests"]["w"]["admit_waits"] == 1
    head.status = NS(name="WAITING_FOR_FSM")  # a grammar not compiled yet: skipped, w counted again
    pool.get_num_free_blocks = lambda: 1
    _step(books, s, {"a": 1})
    assert facts.data["requests"]["w"]["admit_waits"] == 2
    s.max_num_active_reqs = 2  # no slot left: w waits by design
    s.running = [a, a]
    _step(books, s, {"a": 1})
    assert facts.data["requests"]["w"]["admit_waits"] == 2


def test_a_slot_held_by_a_request_that_only_waits_for_its_last_token_is_free():
    """Issue 44, item 3: admission by what can run. A running request whose in-flight tokens reach
    max_tokens (vLLM's async guard will not schedule it again) holds its place in `running`, which
    vLLM's admission counts (vllm-project/vllm#45257); to the oracle its slot is free, and a
    schedule that ran nothing at all (every slot held that way) counts too. A request scheduled in
    this step for its last token holds its slot: it runs in it."""
    from harness.agents.vllm import steps as vllm_steps
    books, facts = _books()
    vllm_steps._BOOKS = books

    def at_cap(rid):  # prompt 3, max_tokens 1: its one token is in flight
        r = _req(rid, max_tokens=1)
        r.num_prompt_tokens, r.num_computed_tokens, r.num_output_placeholders = 3, 3, 1
        return r
    a, b, w = at_cap("a"), at_cap("b"), _req("w", (7, 8))
    w.status, w.num_preemptions = NS(name="WAITING"), 0
    pool = NS(get_num_free_blocks=lambda: 10)
    s = NS(requests={"a": a, "b": b, "w": w}, running=[a, b], waiting=[w], max_num_scheduled_tokens=64,
           max_num_active_reqs=2, kv_cache_manager=NS(block_pool=pool), block_size=16,
           _pause_state=NS(name="UNPAUSED"))
    assert [r.request_id for r in vllm_steps.done_waiting(s, {})] == ["a", "b"]
    # the schedule ran nothing: both slots held by requests that only wait for their last token
    books.after_schedule(s, NS(num_scheduled_tokens={}, total_num_scheduled_tokens=0))
    assert facts.data["requests"]["w"]["admit_waits"] == 1
    assert "a" not in facts.data["requests"] or facts.data["requests"]["a"]["scheduled"] == 0  # no step booked
    # a runs its last token in this step (scheduled): its slot is taken; b's is still free
    books.after_schedule(s, NS(num_scheduled_tokens={"a": 1}, total_num_scheduled_tokens=1))
    assert facts.data["requests"]["w"]["admit_waits"] == 2
    b.max_tokens = 2  # b one token short of its cap: it still runs, its slot is held
    books.after_schedule(s, NS(num_scheduled_tokens={"a": 1}, total_num_scheduled_tokens=1))
    assert facts.data["requests"]["w"]["admit_waits"] == 2
    s.waiting = []  # no newcomer: an empty schedule counts nothing
    books.after_schedule(s, NS(num_scheduled_tokens={}, total_num_scheduled_tokens=0))
    assert facts.data["requests"]["w"]["admit_waits"] == 2


def test_max_tokens_row_allows_one_sample_per_in_flight_drop():
    """The max_tokens_1_2 row counts sampling steps of max-1/2 requests over the run; a preemption
    with the request's step in flight drops that sample and draws the position again (vLLM's
    design), so async on may spend one more per drop the agent counted (measured: configuration
    one-seq, where the workload's prefix-cache reset preempts a running max-2 request: 5 on, 4 off).
    Without the drop counted, one more is still a finding."""
    from equivalence.path_judge import row_findings
    row = vp.PATHS_BY_NAME["max_tokens_1_2"]
    r = vllm_workload.path_request("m2", [7, 8, 9], 2, ["max_tokens_1_2"])
    key = request_key(r.prompt_ids, 2)
    cnt_off = {"sampled_max2": 4, "max2_requests": 2}
    for ev, bad in (({"stale_dropped:reset": 1}, False), ({}, True), ({"scheduled_at_cap": 1}, True)):
        pr = vp.PathRun([r], Run([]), Run([]), cnt_off, {"sampled_max2": 5}, release="0.32.0",
                        steps={False: {"x": [key, 2, 2, 0, 0, 0, L]}, True: {"y": [key, 3, 3, 0, 0, 1, L, ev]}})
        got = [f for f in row_findings(row, pr) if f.startswith("max_tokens 2")]
        assert bool(got) == bad, (ev, got)
    pr = vp.PathRun([r], Run([]), Run([]), cnt_off, {"sampled_max2": 6}, release="0.32.0",
                    steps={False: {}, True: {"y": [key, 3, 3, 0, 0, 1, L, {"stale_dropped:reset": 1}]}})
    assert [f for f in row_findings(row, pr) if "+1 allowed" in f], "two more for one drop"


def test_a_drafter_s_slots_come_out_of_the_budget_before_a_wait_is_counted(monkeypatch):
    """With a drafter vLLM takes max_num_new_slots_for_drafting input-budget slots per scheduled
    request (draft_model: 1) and stops scheduling once no more than those are left: a request left
    out there sat out by design (the first spec-draft gate counted such waits)."""
    from harness.agents.vllm import steps as vllm_steps
    monkeypatch.setattr(vllm_steps, "_TAKES_DRAFT_SLOTS", [True])  # the 0.28.0+ scheduler
    for slots, counted in ((1, 0), (0, 1)):
        books, facts = _books()
        reqs = [_req(f"r{i}", max_tokens=9) for i in range(5)]
        s = _sched(reqs, budget=20)
        s.vllm_config = NS(speculative_config=NS(max_num_new_slots_for_drafting=slots))
        _step(books, s, {f"r{i}": 3 for i in range(5)})  # prefills
        _step(books, s, {f"r{i}": 4 for i in range(4)})  # 1+3 tokens each; r4 left out: 16 + 4 slots = 20
        _step(books, s, {f"r{i}": 4 for i in range(1, 5)})  # r4 runs again
        assert facts.data["requests"]["r4"]["waited"] == counted, slots
    assert vllm_steps.draft_slots(NS(vllm_config=NS(speculative_config=None))) == 0
    monkeypatch.setattr(vllm_steps, "_TAKES_DRAFT_SLOTS", [False])  # before 0.28.0 the property goes unused
    assert vllm_steps.draft_slots(NS(vllm_config=NS(speculative_config=NS(max_num_new_slots_for_drafting=1)))) == 0


def test_with_drafts_a_capped_request_may_spend_one_step_more_never_two():
    """vLLM's async guard at max_tokens counts only the sure token of a step whose drafts may be
    rejected: when they are accepted and reach max_tokens, the step scheduled meanwhile is one past
    it by design (measured on stock 0.32.0: p0, n0; stress c1r1). Two are still caught."""
    off = _arm(**{K0: (1, 2, 2, 0, 0, L)})
    assert steps.compare(REQS, off, _arm(**{K0: (1, 3, 3, 0, 0, L)}), drafted={K0}).findings == []
    assert steps.compare(REQS, off, _arm(**{K0: (1, 4, 4, 0, 0, L)}), drafted={K0}).findings
    assert steps.compare(REQS, off, _arm(**{K0: (1, 3, 3, 0, 0, L)})).findings  # no drafts: caught
