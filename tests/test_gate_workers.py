"""`check --workers N` spreads the suites' cases over N processes with pytest-xdist and reports
exactly what a run in one process reports: the same suites in the same order, the same counts
and the same first finding per suite."""
import pytest

from harness.gate import run_suites
from harness.commands.check import worker_count

SUITES = ["test_war_slot_table", "test_fence_placement"]


def _table(res):
    return [(s.suite, s.cases, s.passed, s.failed, s.skipped, s.first_failure, s.first_step)
            for s in res.suites.values()]


@pytest.mark.slow
def test_workers_give_the_same_verdict_table_as_one_process():
    pytest.importorskip("xdist")
    one = run_suites("ref", ("no_fence",), suites=SUITES, workers=1)
    two = run_suites("ref", ("no_fence",), suites=SUITES, workers=2)
    assert one.exit_code == two.exit_code == 1
    assert any(s.failed for s in one.suites.values()), "the fault must be found for the comparison to mean much"
    assert _table(two) == _table(one)


def test_worker_count_flag():
    import argparse
    assert worker_count("3") == 3 and worker_count("auto") >= 1
    for bad in ("0", "-2", "many"):
        with pytest.raises(argparse.ArgumentTypeError):
            worker_count(bad)
