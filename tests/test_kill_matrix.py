"""The fault kill matrix: every fault in the catalogue is caught by the suite it names, and the
correct engine sets off no suite.

.ci/run's tier runs each fault against the suite that must catch it, in-process, one test per fault
(so xdist spreads them), and the correct engine against every suite: the suites themselves, which
.ci/run runs at `check`'s default seeds (over 2 and 10 seeds through the real CLI:
tests/test_check_cli.py::test_correct_engine_passes_every_suite, scheduled). The whole
matrix (every suite against every fault, `overlap-harness mutants`, about ten minutes on two
cores) is the scheduled tier's (make test-scheduled)."""
import json
import subprocess
import sys

import pytest

from harness.faults import CATALOGUE

CLI = [sys.executable, "-m", "harness.cli"]


def oh(*args, timeout=1200):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("fault", sorted(CATALOGUE))
def test_fault_caught_by_its_suite(fault):
    """The suite stops at its first failed case (maxfail=1): one is the catch; the cases after it
    would only say again what the first said (the whole matrix runs every case: test_the_whole_matrix)."""
    from harness.gate import run_suites
    suite = CATALOGUE[fault].suite
    res = run_suites("ref", (fault,), 1, suites=[suite], maxfail=1)
    s = res.suites[suite]
    assert res.exit_code in (0, 1) and s.cases > s.skipped, (res.exit_code, s)
    assert s.failed > 0, f"{fault} missed by {suite}: {s}"


@pytest.fixture(scope="module")
def matrix():
    # every suite against the correct engine and against every fault, one seed
    r = oh("mutants", "--json", "--seeds", "1", timeout=3600)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.slow
@pytest.mark.scheduled
def test_the_whole_matrix(matrix):
    """Scheduled; .ci/run's representatives are test_fault_caught_by_its_suite (each fault, its
    suite) and the suites themselves on the correct engine (.ci/run runs races/, equivalence/ and
    evals/ at check's default seeds)."""
    assert matrix["correct"], "no suite ran"
    noisy = [s for s, v in matrix["correct"].items() if v["caught"]]
    assert not noisy, f"false alarm on the correct engine: {noisy}"
    missed = [f for f, v in matrix["faults"].items() if not v["caught_by_intended"]]
    assert not missed, f"missed by the suite that must catch them: {missed}"
    assert set(matrix["faults"]) == set(CATALOGUE) and matrix["ok"] is True
