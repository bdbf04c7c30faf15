"""Verdicts as data (issue 42, item 3): a known-upstream entry claims a finding by its code and
its evidence, never by its words; the steps oracle names what it found; step records are read by
name (and the positional records of older agents and stored fixtures still read); the gate's
HANG list is the cases whose status is HANG, not those whose message says so."""
import pytest

from harness.agents.vllm.steps import FIELDS, request_key
from harness.gate import _Collector
from harness.oracles import steps
from harness.targets.vllm import upstream as vllm_upstream
from harness.verdict import Finding, Status, code_of
from harness.engine.request import Request

PAST = "request r0: 3 sampling steps async on, 2 off (max_tokens 2, capped in both): 1 step(s) past max_tokens"
CAPPED = {"scheduled_at_cap": 1}  # async-step-past-max-tokens' mechanism, counted for r0


def _classify(finding, evidence=CAPPED, version="0.11.0"):
    return vllm_upstream.classify("steps", [finding], None, None, version, evidence=lambda f: dict(evidence))


def test_a_known_entry_does_not_claim_a_finding_in_its_words_with_another_code():
    """async-step-past-max-tokens claims steps.past_cap: a finding that says "past max_tokens" but
    whose oracle named it otherwise (an extra step of a request that stopped on a token) is new,
    its mechanism counted or not."""
    worded = Finding(PAST, "steps.extra", "r0")
    new, seen, _ = _classify(worded)
    assert seen == [] and new == [worded] and code_of(new[0]) == "steps.extra"
    bare = PAST  # a sentence no oracle coded: nothing claims it by its words either
    new, seen, _ = _classify(bare)
    assert seen == [] and new == [bare]


def test_a_known_entry_claims_its_code_however_the_finding_is_worded():
    reworded = Finding("request r0 was sampled once too often", "steps.past_cap", "r0")
    new, seen, _ = _classify(reworded)
    assert new == [] and seen == [("async-step-past-max-tokens", reworded)]
    # ... and only with its evidence, and only in its releases
    new, seen, _ = _classify(reworded, evidence={})
    assert seen == [] and "looks like known upstream async-step-past-max-tokens" in new[0]
    assert code_of(new[0]) == "steps.past_cap"  # the note keeps the finding's code
    new, seen, _ = _classify(reworded, version="0.32.0")
    assert seen == [] and "not live in 0.32.0" in new[0]


def test_an_engine_exception_entry_claims_a_crash_by_the_engines_own_line():
    """cpu-ipex-vnni-decode claims a crash whose engine exception line is IPEX's; the same line in
    a divergence's finding (our words quoting it) is not a crash."""
    line = "CRASH: vllm (overlap on) exited with code 1 while test_path ran: RuntimeError: Sliding window unsupported"
    crash, quoted = Finding(line, "crash"), Finding(line, "divergence", "p0")
    _, seen, _ = vllm_upstream.classify("prefix_cache_hit", [crash], version="0.11.0")
    assert [k for k, _ in seen] == ["cpu-ipex-vnni-decode"]
    new, seen, _ = vllm_upstream.classify("prefix_cache_hit", [quoted], version="0.11.0")
    assert seen == [] and new == [quoted]


def _arm(**recs):
    return steps.summed(recs)


def _rec(key, sampled, finish="FINISHED_LENGTH_CAPPED", waited=0, admit=0, named=True):
    values = [key, sampled, sampled, waited, 0, 0, finish, {}, 0, admit, 0, 0, 0, 0]
    return dict(zip(FIELDS, values)) if named else values[:8]  # an older agent: eight fields, by position


@pytest.mark.parametrize("named", [True, False])
def test_the_steps_oracle_codes_each_finding_and_reads_named_and_positional_records(named):
    reqs = [Request(rid=r, prompt_ids=[i + 1, 2], max_new_tokens=2) for i, r in enumerate(("a", "b", "c"))]
    k = [request_key(r.prompt_ids, 2) for r in reqs]
    off = _arm(a=_rec(k[0], 2, named=named), b=_rec(k[1], 2, named=named), c=_rec(k[2], 2, named=named))
    on = _arm(a=_rec(k[0], 3, named=named), b=_rec(k[1], 2, waited=2, named=named),
              c=_rec(k[2], 2, admit=3 if named else 0, named=named))
    v = steps.compare(reqs, off, on)
    got = {f.rid: code_of(f) for f in v.findings}
    want = {"a": "steps.past_cap", "b": "steps.waited"} | ({"c": "admission.starved"} if named else {})
    assert got == want, v.findings
    assert v.compared == 3 and v.length_capped == 3


def test_a_step_record_is_one_named_type():
    rec = steps.StepRecord.of(_rec("k:2", 4))
    assert rec.key == "k:2" and rec.sampled == 4 and rec.finish == "FINISHED_LENGTH_CAPPED" and rec.overlapped == 0
    old = steps.StepRecord.of(_rec("k:2", 4, named=False))
    assert old.sampled == 4 and old.admit_waits == 0 and old.overlapped is None  # not kept by that agent
    assert steps.StepRecord._fields == FIELDS


CASES = '''
import pytest
from harness.targets.base import TargetHang

def test_hang():
    raise TargetHang("HANG: vllm (overlap on): no new token for 30.0 s")

def test_says_hang():
    pytest.fail("HANG in the words of a finding, not a hang", pytrace=False)
'''


def test_the_gates_hangs_are_the_cases_whose_status_is_hang(tmp_path):
    f = tmp_path / "test_hangs.py"
    f.write_text(CASES)
    col = _Collector(None)
    assert pytest.main([str(f), "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                        "--import-mode=importlib"], plugins=[col]) == 1
    res = col.res
    assert [c["status"] for c in res.cases] == [Status.HANG, Status.FAIL]
    assert len(res.hangs) == 1 and res.hangs[0].startswith("HANG: vllm (overlap on)")
    assert res.suites["test_hangs"].first_failure.startswith("HANG: vllm")
