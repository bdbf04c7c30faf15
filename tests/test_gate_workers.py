"""`check --workers N` spreads the suites' cases over N processes with pytest-xdist and reports
exactly what a run in one process reports: the same suites in the same order, the same counts
and the same first finding per suite."""
import pytest

from harness.gate import run_suites
from harness.flags import worker_count

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


def test_cases_go_to_the_workers_longest_first(tmp_path, monkeypatch):
    """Case times are kept between runs; the xdist scheduler hands out the longest first, one at
    a time, so the last case to finish is a short one (in collection order the GSM8K gate, the
    longest case, came last and ran alone)."""
    pytest.importorskip("xdist")
    from harness import gate
    monkeypatch.setenv("OVERLAP_HARNESS_CACHE", str(tmp_path))
    assert gate.load_durations() == {}
    gate.save_durations({"races/a.py::x": 2.0, "races/a.py::y": 5.0})
    gate.save_durations({"races/a.py::z": 1.0})  # merged with the first run's
    known = gate.load_durations()
    assert known == {"races/a.py::x": 2.0, "races/a.py::y": 5.0, "races/a.py::z": 1.0}

    class Config:  # what xdist's LoadScheduling reads
        def getvalue(self, name):
            return ["2*popen"] if name == "tx" else None

        def getoption(self, name):
            return None

    collection = ["races/a.py::x", "races/a.py::y", "races/a.py::z", "races/b.py::new", "evals/e.py::gate"]
    sched = gate._longest_first(Config(), None, gate._case_cost(known))
    sent = []

    class Node:
        shutting_down = False

        def __init__(self, name):
            self.gateway = type("Gateway", (), {"id": name})()

        def send_runtest_some(self, idx):
            sent.extend(collection[i] for i in idx)

        def shutdown(self):
            pass
    nodes = [Node("gw0"), Node("gw1")]
    for n in nodes:
        sched.add_node(n)
        sched.add_node_collection(n, collection)
    sched.schedule()
    while sched.pending:  # each worker finishes its first case and asks for more
        for n in nodes:
            if sched.node2pending[n]:
                sched.mark_test_complete(n, sched.node2pending[n][0])
    # never timed: the evals case first, a new case as the typical one (ties keep collection order)
    assert sent == ["evals/e.py::gate", "races/a.py::y", "races/a.py::x", "races/b.py::new", "races/a.py::z"]
