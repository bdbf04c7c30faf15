"""`check` through the real CLI on the ref engine: the correct engine passes, a fault fails it, and
an unknown fault is refused. A module of its own, beside the kill matrix's (tests/test_kill_matrix.py):
xdist's --dist loadscope gives each module to one worker, and the two together were the longest
worker's load."""
import pytest

from tests.test_kill_matrix import oh

SUITES = ["--suite", "test_war_slot_table", "--suite", "test_fence_placement"]


@pytest.mark.slow
@pytest.mark.scheduled
@pytest.mark.parametrize("seeds", [2, 10])
def test_correct_engine_passes_every_suite(tmp_path, seeds):
    """Scheduled (every suite over 2 and 10 seeds through the CLI; `check --seeds 200` is the long
    sweep). .ci/run's representatives: every suite of races/, equivalence/ and evals/ runs in .ci/run
    itself on the correct engine at `check`'s default seeds (the same cases `check` collects), and
    test_check_passes_the_correct_engine_and_fails_a_fault (the CLI's verdict, exit code and JUnit)."""
    junit = tmp_path / "check.xml"
    r = oh("check", "--seeds", str(seeds), "--junit", str(junit))
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "PASS" in r.stdout and junit.exists()


def test_check_passes_the_correct_engine_and_fails_a_fault(tmp_path):
    # one worker: a second one only adds a process start on a CI worker already sharing two cores
    # (tests/test_gate_workers.py shows two workers give the same table)
    junit = tmp_path / "check.xml"
    r = oh("check", *SUITES, "--workers", "1", "--junit", str(junit))
    assert r.returncode == 0 and "PASS" in r.stdout and junit.exists(), r.stdout + r.stderr[-2000:]
    r = oh("check", "--fault", "no_fence", *SUITES, "--workers", "1")
    assert r.returncode == 1 and "FAIL" in r.stdout and "WAR hazard on req_to_token" in r.stdout
    assert {ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith("test_")} == \
        {"test_war_slot_table", "test_fence_placement"}, r.stdout  # only the suites asked for


def test_check_refuses_unknown_suites_and_faults():
    r = oh("check", "--suite", "nosuch")
    assert r.returncode == 2 and r.stderr.strip().startswith("overlap-harness: error: unknown suite 'nosuch'")
    r = oh("check", "--fault", "nosuch")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "known: no_fence" in r.stderr
