"""The agent counts, per request, the mechanisms of known upstream bugs (issue 36: a known entry
claims a finding only with its own mechanism counted for that request). Here the agent's step
books (harness/agents/vllm/steps.py) are driven by stand-ins of vLLM's scheduler objects, and
the preemption path is read from the calling vLLM function as in the engine: a preemption by
`reset_prefix_cache` that drops the in-flight sample counts `stale_dropped:reset`, one by
`schedule` (KV pressure) `stale_dropped:kv_pressure`, one that keeps (delivers) its in-flight
output nothing; a step scheduled with the request's last token in flight counts
`scheduled_at_cap`. The books summed per request carry them (harness/oracles/steps.py)."""
from types import SimpleNamespace

from harness.agents.vllm import steps as vllm_steps
from harness.engine.request import Request
from harness.oracles import steps
from harness.verdict import Finding


# the path features the books count beside the known bugs' mechanisms (issue 44, item 2): each
# has its own test (tests/test_vllm_combos_plan.py); here only the mechanisms
PATH_FEATURES = ("prefix_hit", "prefill_chunk", "preempted_in_flight")


def _known(rec) -> dict:
    return {k: n for k, n in rec["evidence"].items() if k not in PATH_FEATURES}


class _Facts:
    def __init__(self):
        self.data = {}

    def set(self, **kw):
        self.data.update(kw)


def _req(rid, prompt, max_tokens, **kw):
    return SimpleNamespace(request_id=rid, prompt_token_ids=prompt, max_tokens=max_tokens, num_output_tokens=0,
                           num_computed_tokens=0, num_tokens=len(prompt), num_output_placeholders=0,
                           drop_stale_output=False, num_stale_output_tokens=0, status=None, **kw)


# vLLM's two callers of _preempt_request, defined in a module named as vLLM's scheduler is
_CALLERS = {"__name__": "vllm.v1.core.sched.scheduler"}
exec("def reset_prefix_cache(preempt, r):\n    preempt(None, r)\n"
     "def schedule(preempt, r):\n    preempt(None, r)\n", _CALLERS)


def _books():
    facts = _Facts()
    books = vllm_steps.Books(lambda role: facts)
    vllm_steps._BOOKS = books
    return books, facts


def test_a_dropped_in_flight_sample_is_counted_by_the_path_that_preempted():
    books, facts = _books()

    def engine_preempt(self, r):  # vLLM's _preempt_request: marks the in-flight output stale
        r.num_stale_output_tokens = r.num_output_placeholders
        r.num_output_placeholders = 0
    preempt = vllm_steps._preempt(engine_preempt)
    reset, pressure, kept = (_req(x, [1, 2, 3], 8) for x in ("a", "b", "c"))
    for r in (reset, pressure, kept):
        r.num_output_placeholders = 1  # a step of it in flight
    reset.drop_stale_output = pressure.drop_stale_output = True
    _CALLERS["reset_prefix_cache"](preempt, reset)
    _CALLERS["schedule"](preempt, pressure)
    _CALLERS["schedule"](preempt, kept)  # delivered, not dropped: not the mechanism
    recs = facts.data["requests"]
    # no token of their own delivered yet: the step dropped carried their prompt logprobs too
    assert _known(recs["a"]) == {"stale_dropped:reset": 1, "stale_dropped_prompt:reset": 1}
    assert _known(recs["b"]) == {"stale_dropped:kv_pressure": 1, "stale_dropped_prompt:kv_pressure": 1}
    assert _known(recs["c"]) == {} and recs["c"]["preempted"] == 1  # preempted all the same
    summed = steps.summed(recs)
    r = Request(rid="x", prompt_ids=[1, 2, 3], max_new_tokens=8)
    assert steps.evidence_of(summed, r) == {"stale_dropped:reset": 1, "stale_dropped:kv_pressure": 1,
                                            "stale_dropped_prompt:reset": 1, "stale_dropped_prompt:kv_pressure": 1,
                                            "preempted_in_flight": 3}  # c's too: its step was in flight


def test_a_drop_after_the_first_token_is_not_a_prompt_logprobs_drop():
    """Issue 44: async-prompt-logprobs-dropped-on-reset is the drop of the step that carries the
    prompt logprobs (the last prompt chunk's). A request with tokens of its own delivered lost
    none of them to a later drop: its evidence says `stale_dropped:reset` only."""
    books, facts = _books()

    def engine_preempt(self, r):
        r.num_stale_output_tokens, r.num_output_placeholders = r.num_output_placeholders, 0
    preempt = vllm_steps._preempt(engine_preempt)
    late = _req("d", [1, 2, 3], 8)
    late.num_output_tokens, late.num_output_placeholders, late.drop_stale_output = 3, 1, True
    _CALLERS["reset_prefix_cache"](preempt, late)
    assert _known(facts.data["requests"]["d"]) == {"stale_dropped:reset": 1}


def test_a_step_scheduled_with_the_last_token_in_flight_is_counted():
    books, facts = _books()
    r = _req("a", [1, 2], 2)
    r.num_computed_tokens = r.num_tokens  # a decode step: it samples
    sched = SimpleNamespace(requests={"a": r}, running=[r], max_num_scheduled_tokens=64)
    out = SimpleNamespace(total_num_scheduled_tokens=1, num_scheduled_tokens={"a": 1})
    # its second (last) token is scheduled now: the schedule added this step's placeholder, no evidence
    r.num_output_tokens, r.num_output_placeholders = 1, 1
    books.after_schedule(sched, out)
    assert _known(facts.data["requests"]["a"]) == {}
    r.num_output_placeholders = 2  # that token still in flight, and the request is scheduled again
    books.after_schedule(sched, out)
    assert _known(facts.data["requests"]["a"]) == {"scheduled_at_cap": 1}


def test_a_structured_output_step_with_a_token_in_flight_is_counted_and_claims_only_where_live():
    """vllm#26866's mechanism (before 0.11.1 the grammar mask is built in schedule(), a step
    behind the token in flight): counted per request, and the entry claims a structured-output
    request's finding only with it counted, only in its release range."""
    from harness.targets.vllm import upstream as vllm_upstream
    books, facts = _books()
    g, plain = _req("g", [1, 2], 8, use_structured_output=True), _req("p", [1, 2], 8)
    for r in (g, plain):
        r.num_computed_tokens, r.num_output_tokens, r.num_output_placeholders = r.num_tokens, 1, 2
    sched = SimpleNamespace(requests={"g": g, "p": plain}, running=[g, plain], max_num_scheduled_tokens=64)
    books.after_schedule(sched, SimpleNamespace(total_num_scheduled_tokens=2, num_scheduled_tokens={"g": 1, "p": 1}))
    recs = facts.data["requests"]
    assert _known(recs["g"]) == {"grammar_in_flight": 1} and _known(recs["p"]) == {}
    f = Finding("request so0: 13 sampling steps async on, 9 off (stopped on a token: at most 1 more allowed)",
                "steps.extra", "so0")
    with_it, without = (lambda _: {"grammar_in_flight": 3}), (lambda _: {})
    for version, ev, claimed in (("0.11.0", with_it, True), ("0.11.0", without, False), ("0.11.1", with_it, False)):
        new, seen, _ = vllm_upstream.classify("steps", [f], counts=None, version=version, evidence=ev)
        assert bool(seen) == claimed and bool(new) != claimed, (version, new, seen)
        if claimed:
            assert seen[0][0] == "vllm#26866"


def test_before_stale_output_books_the_reset_drops_what_was_in_flight():
    """vLLM before 0.27.0 has no drop_stale_output / num_stale_output_tokens: its reset path marks a
    preempted request to discard its next output (the one in flight), KV pressure keeps it. The sweep's
    stress on 0.16.0 found a seeded request reset with a step in flight whose divergence looked like
    async-seeded-preempt-in-flight without the mechanism counted: the steps in flight are the
    placeholders the request had when vLLM began to preempt it."""
    books, facts = _books()

    def engine_preempt(self, r):  # 0.16.0's _preempt_request: rolls the request back; the reset then
        r.num_output_placeholders = 0  # sets discard_latest_async_tokens (after this returns)

    preempt = vllm_steps._preempt(engine_preempt)
    old = [SimpleNamespace(request_id=x, prompt_token_ids=[1, 2, 3], max_tokens=8, num_output_tokens=2,
                           num_computed_tokens=5, num_tokens=5, num_output_placeholders=ph, status=None)
           for x, ph in (("a", 1), ("b", 1), ("c", 0))]
    _CALLERS["reset_prefix_cache"](preempt, old[0])  # a step in flight, thrown away
    _CALLERS["schedule"](preempt, old[1])  # KV pressure: in flight, delivered
    _CALLERS["reset_prefix_cache"](preempt, old[2])  # nothing in flight: nothing dropped
    recs = facts.data["requests"]
    assert recs["a"]["evidence"] == {"preempted_in_flight": 1, "stale_dropped:reset": 1}  # tokens delivered before
    assert recs["b"]["evidence"] == {"preempted_in_flight": 1}
    assert recs["c"]["evidence"] == {} and recs["c"]["preempted"] == 1
