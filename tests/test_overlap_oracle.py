"""The overlap-lost oracle (harness.oracles.overlap, races/test_overlap_effective): quiet on the correct
engine, LOST under `wait_before_issue` although the tokens stay right, reported by `run` and
`check` as "overlap: effective / LOST"."""
import json
import subprocess
import sys

import pytest

from harness.cli import main
from harness.oracles.overlap import early_waits, judge
from harness.targets.ref import RefTarget
from races.scenarios import SCENARIOS


def _runs(faults, scenario="row_reuse"):
    t = RefTarget(faults=faults)
    reqs, kw, _ = SCENARIOS[scenario](t.tokenizer(), 0)
    return t.run(reqs, overlap=False, **kw), t.run(reqs, overlap=True, **kw)


@pytest.mark.parametrize("scenario", ["row_reuse", "spec_oracle"])
def test_correct_engine_overlaps(scenario):
    off, on = _runs(frozenset(), scenario)
    v = judge(on.engine, off.summary)
    assert v.effective is True and v.early_waits == 0, v.reasons
    assert v.gap_on < v.gap_off and v.period_on < v.period_off
    assert v.line.startswith("overlap: effective")


def test_wait_before_issue_keeps_tokens_but_loses_overlap():
    ref_off, _ = _runs(frozenset())
    off, on = _runs(frozenset({"wait_before_issue"}))
    assert on.outputs == off.outputs == ref_off.outputs  # the tokens cannot tell
    waits = early_waits(on.engine.dev)
    assert waits and "before issuing step 1" in waits[0]
    v = judge(on.engine, off.summary)
    assert v.effective is False and v.line.startswith("overlap: LOST") and "host wait(s)" in v.reasons[0]
    assert v.gap_on > judge(_runs(frozenset())[1].engine, off.summary).gap_on  # the GPU idles between steps


def test_overlap_off_and_ngram_are_not_judged():
    off, _ = _runs(frozenset())
    assert judge(off.engine, None).effective is None
    _, on = _runs(frozenset(), "spec_ngram")
    assert judge(on.engine, None, ngram=True).effective is None


def test_run_reports_the_verdict(capsys):
    args = ["run", "--prompt", "The overlap", "--prompt", "x", "--max-tokens", "6", "--json"]
    assert main(args) == 0
    s = json.loads(capsys.readouterr().out)["summary"]
    assert s["overlap_verdict"]["effective"] is True and s["overlap_line"].startswith("overlap: effective")
    assert main(args + ["--fault", "wait_before_issue"]) == 0
    s = json.loads(capsys.readouterr().out)["summary"]
    assert s["overlap_verdict"]["effective"] is False and "LOST" in s["overlap_line"]


@pytest.mark.slow
@pytest.mark.scheduled
def test_check_fails_only_on_the_overlap_oracle_under_wait_before_issue():
    """Scheduled (the whole gate under one fault); .ci/run's representative is the kill matrix's
    test_fault_caught_by_its_suite[wait_before_issue] with the overlap tests of this module."""
    r = subprocess.run([sys.executable, "-m", "harness.cli", "check", "--fault", "wait_before_issue"],
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 1 and "overlap: LOST" in r.stdout, r.stdout + r.stderr[-2000:]
    failed = [ln.split()[0] for ln in r.stdout.splitlines()
              if ln.startswith("test_") and len(ln.split()) > 3 and ln.split()[3] != "0"]
    assert failed == ["test_overlap_effective"], r.stdout
