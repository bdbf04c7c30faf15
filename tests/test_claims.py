"""A claim must explain the whole finding (issue 44, item 1; harness/search/served/claims.py).

A known entry's claim is tested by the case run again without the entry's trigger: the finding
must go away, or it is new, reported with both runs. Here the judge's two arms are stand-ins
whose findings depend on what the case holds, as the engine's would: stock vLLM drops a
preempted request's in-flight sample only on the reset path (the divergence needs the reset),
and the source patch pressure_preempt_drops_in_flight drops it on the KV-pressure path too (the
divergence stays without the reset). The real engine's run of both is in docs/results (the
claims page) and tests/test_vllm_claims.py."""
from types import SimpleNamespace

import pytest

from harness.engine.request import Request
from harness.search.served import claims
from harness.search.served import judge as judge_mod
from harness.search.served.case import ServedCase
from harness.search.served.judge import Finding, Verdict
from harness.targets.base import Run
from harness.targets.vllm import upstream as vllm_upstream

SEEDED = "async-seeded-preempt-in-flight"


def _case(controls=((0.5, "reset"),)):
    r = Request(rid="c0r0", prompt_ids=[1, 2, 3, 4], max_new_tokens=16, temperature=0.8, seed=7)
    r.extra = {"frequency_penalty": 0.5}
    return ServedCase([r], {}, list(controls))


def _divergence(why="the in-flight sample dropped on the reset, kv_pressure path"):
    return Finding("divergence", f"request c0r0 diverges at token 3 (x): off [1] vs on [2] (a sampled request "
                   f"preempted async on; {why})", ("divergence",), "divergence.sampled_preempted", "c0r0")


@pytest.fixture
def engine(monkeypatch):
    """The judge's arms as a stand-in engine: `kv_drops` says whether the KV-pressure path drops
    the in-flight sample (the patch) or delivers it (stock). The request is preempted by KV
    pressure in every run, and by the reset when the case sends one."""
    state = SimpleNamespace(kv_drops=False, runs=[])

    def run_arm(target, case, overlap, agent=True):
        state.runs.append((overlap, [c for _, c in case.controls]))
        return {"run": Run([]), "controls": [], "counts": {}, "steps": {}, "books": {}}

    def findings(case, off, on, agent, evidence=None, decode=None, left_out=None):
        reset = any(c == "reset" for _, c in case.controls)
        ev = {"stale_dropped:reset": 1} if reset else {}
        if state.kv_drops:
            ev["stale_dropped:kv_pressure"] = 1
        if not ev:
            return []
        f = _divergence()
        evidence[f.summary] = ev
        return [f]
    monkeypatch.setattr(judge_mod, "run_arm", run_arm)
    monkeypatch.setattr(judge_mod, "_findings", findings)
    monkeypatch.setattr(judge_mod, "_effects", lambda *a: {})
    monkeypatch.setattr(judge_mod, "feature_overlap", lambda case, books: ({}, {}))
    return state


def test_stock_a_claim_that_explains_the_finding_holds(engine):
    """Stock: without the reset the request is still preempted (KV pressure), but its sample is
    delivered, and the divergence goes away: the entry's claim holds, tested once."""
    v = judge_mod.judge(SimpleNamespace(name="vllm"), _case(), "0.32.0")
    assert v.new == [] and [k for k, _ in v.known] == [SEEDED]
    assert v.claims == {"tested": 1, "held": 1, "refuted": 0, "untestable": 0}
    assert [c for _, c in engine.runs] == [["reset"], ["reset"], [], []]  # the case, then without its trigger


def test_a_patch_on_a_path_that_shares_the_case_is_new_with_both_runs(engine):
    """The issue's example: the patch drops the in-flight sample on the KV-pressure path too. The
    request carries the entry's evidence (the reset dropped one as well), so the claim alone
    filed the whole divergence as known; without the reset it stays: new, both runs named."""
    engine.kv_drops = True
    v = judge_mod.judge(SimpleNamespace(name="vllm"), _case(), "0.32.0")
    assert v.known == [] and len(v.new) == 1, v
    f = v.new[0]
    assert f.summary.startswith(_divergence().summary + f" (claimed by known upstream {SEEDED}, but it stays "
                                "without the entry's trigger (controls reset/pause/pause_wait/pause_abort removed): ")
    assert f.summary.endswith("; new)") and f.rid == "c0r0" and f.signature[-2:] == ("claim refuted", SEEDED)
    assert v.claims == {"tested": 1, "held": 0, "refuted": 1, "untestable": 0}


def test_the_run_without_the_trigger_tests_no_claim_of_its_own(engine):
    engine.kv_drops = True
    v = judge_mod.judge(SimpleNamespace(name="vllm"), _case(), "0.32.0", claims=False)
    assert [k for k, _ in v.known] == [SEEDED] and v.claims == {} and len(engine.runs) == 2


def test_a_case_without_the_trigger_cannot_test_the_claim():
    """Nothing to remove (a configuration, or a case that does not hold the trigger): counted as
    not tested, the claim stands, no run is spent."""
    k = next(k for k in vllm_upstream.KNOWN_UPSTREAM if k.id == SEEDED)
    assert claims.without(_case(controls=()), k.cause) is None
    f = _divergence()
    v = Verdict(new=[], known=[(SEEDED, f.summary)], claimed=[(SEEDED, f)])
    claims.test(lambda c: pytest.fail("no run without a trigger to remove"), _case(controls=()), v, "0.32.0")
    assert v.known == [(SEEDED, f.summary)] and v.claims["untestable"] == 1 and v.claims["tested"] == 0
    bare = next(k for k in vllm_upstream.KNOWN_UPSTREAM if k.id == "vllm#52461")
    assert claims.without(_case(), bare.cause) is None  # a configuration: the gate's twin rows test it


def test_a_trigger_is_removed_as_the_shrinker_removes_things():
    from harness.targets.sglang import upstream as sglang_upstream
    case = _case(controls=((0.2, "pause"), (0.4, "reset")))
    case.requests[0].repetition_penalty = 1.3
    seeded = next(k for k in vllm_upstream.KNOWN_UPSTREAM if k.id == SEEDED)
    c = claims.without(case, seeded.cause)
    assert c.controls == [] and case.controls == [(0.2, "pause"), (0.4, "reset")]  # a copy
    pen = sglang_upstream.KNOWN[0]
    c = claims.without(case, pen.cause)
    r = c.requests[0]
    assert r.repetition_penalty == 1.0 and "frequency_penalty" not in r.extra and c.controls == case.controls
    assert case.requests[0].repetition_penalty == 1.3 and case.requests[0].extra == {"frequency_penalty": 0.5}


def test_every_entry_that_claims_a_finding_says_what_sets_it_off_or_why_no_case_can_lose_it():
    """The catalogue: an entry that claims findings either has a trigger a case can lose, or is one
    of those no case can (a release's own step past max_tokens, IPEX's kernel on 0.11.0, a crash
    whose remedy is a configuration): those are counted as not tested, never as held."""
    from harness.targets.sglang import upstream as sglang_upstream
    untestable = {"async-step-past-max-tokens", "cpu-ipex-vnni-decode", "vllm#26385"}
    for k in vllm_upstream.KNOWN_UPSTREAM + sglang_upstream.KNOWN:
        if k.codes == vllm_upstream.NEVER:
            continue
        assert bool(k.cause) != (k.id in untestable), k.id


def test_stress_sums_the_claims_and_says_them(tmp_path):
    from harness.search.served.explore import ServedStress, summary_lines
    s = ServedStress(SimpleNamespace(name="vllm"), None, seconds=1, out=str(tmp_path), agent=False)
    for held in (1, 0):
        v = Verdict(known=[(SEEDED, "x")], claims={"tested": 1, "held": held, "refuted": 1 - held, "untestable": 0})
        s._count(_case(), v)
    assert s.res.claims == {"tested": 2, "held": 1, "refuted": 1, "untestable": 0}
    got = [x for x in summary_lines(s) if x.startswith("claims tested")]
    assert got == ["claims tested without their trigger (issue 44): 2 tested, 1 held (the finding went away), "
                   "1 refuted (new: it stayed), 0 not tested (the case holds no removable trigger)"]


def test_the_gate_tests_a_bare_rows_claim_on_its_twin():
    """vllm#52461's trigger is a configuration: no CLI processor, so vLLM's repair is off. The main
    pair's twin row runs the same entry-point processor with the repair on: there its placeholder
    reads must be 0 (held); a build that also leaves them unrepaired there refutes the claim (new,
    with both counts); a twin that did not run its path tests nothing."""
    from harness.gate import claims as gate_claims
    from harness.targets.vllm import paths as vp
    from harness.verdict import Finding as VFinding
    row = "logits_processor_entry_point_bare"
    f = VFinding("async on: the processor read 15 placeholder(s) where an output token id belongs "
                 "(lp_no_repeat_placeholder_reads)", "placeholders")
    new, seen, _ = vllm_upstream.classify(row, [f], counts={"lp_no_repeat_placeholder_reads": 15}, version="0.32.0")
    assert new == [] and seen == [("vllm#52461", f)]
    ran = {c: 4 for c in vp.PATHS_BY_NAME["logits_processor_entry_point"].counters}
    for counts, outcome, left in (({**ran}, "held", 0), ({**ran, "lp_no_repeat_placeholder_reads": 3}, "refuted", 1),
                                  ({}, "not tested", 0)):
        props = []
        twin = SimpleNamespace(counts_on=counts)
        got_new, got_seen = gate_claims.on_twin(row, [], list(seen), twin, record_property=lambda k, v: props.append((k, v)))
        assert props == [("claim_test", f"{row}: vllm#52461: {outcome}")]
        assert len(got_new) == left and len(got_seen) == 1 - left
        if left:
            assert "stays without the entry's trigger" in got_new[0] and "lp_no_repeat_placeholder_reads 3" in got_new[0]
    assert gate_claims.line([f"{row}: vllm#52461: held", "steps: async-step-past-max-tokens: not tested"]) == (
        "claims tested without their trigger (issue 44): 1 tested, 1 held, 0 refuted (new); 1 not tested here "
        "(stress tests those case by case): logits_processor_entry_point_bare: vllm#52461: held, "
        "steps: async-step-past-max-tokens: not tested")


@pytest.mark.parametrize("stays", [False, True])
def test_the_sglang_suite_sends_the_claimed_requests_again_without_their_penalties(stays):
    """The SGLang overlap suite's claim (sglang-penalty-one-step-old) is tested on the same pair:
    the requests again with their penalties neutral. Its divergence must go away (held); a build
    whose requests diverge without penalties too fails, naming the entry and both runs."""
    from equivalence.test_overlap_equivalence import _claims_without_trigger
    from harness.verdict import Finding as VFinding

    class Pair:
        def __init__(self):
            self.sent = []

        def run(self, reqs, overlap, **kw):
            self.sent.append([(r.rid, r.repetition_penalty, dict(r.extra)) for r in reqs])
            diverge = overlap and (stays or any(r.repetition_penalty != 1.0 for r in reqs))
            return Run([(r.rid, [5, 6, 7] if diverge and r.rid == "p0" else [5, 6, 8], "length") for r in reqs])
    r = Request(rid="p0", prompt_ids=[1, 2, 3], max_new_tokens=3, repetition_penalty=1.3)
    r.extra = {"presence_penalty": 0.5}
    pair, props = Pair(), []
    known = [("sglang-penalty-one-step-old", VFinding("request p0 diverges at token 2 (x)", "divergence", "p0"))]
    record = lambda k, v: props.append(v)  # noqa: E731
    if stays:
        with pytest.raises(pytest.fail.Exception, match="but it stays without the entry's trigger .*request p0 diverges"):
            _claims_without_trigger(pair, [r], {}, known, "seed 0", record)
    else:
        _claims_without_trigger(pair, [r], {}, known, "seed 0", record)
    assert pair.sent[0] == [("p0", 1.0, {})] and r.repetition_penalty == 1.3  # a copy, penalties neutral
    assert props == [f"seed 0: sglang-penalty-one-step-old: {'refuted' if stays else 'held'}"]
