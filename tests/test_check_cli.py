"""`check` through the real CLI on the ref engine: the correct engine passes every suite over 4
seeds, a fault fails it, and an unknown fault is refused. A module of its own, beside the kill
matrix's (tests/test_kill_matrix.py): xdist's --dist loadscope gives each module to one worker,
and the two together were the longest worker's load."""
import pytest

from tests.test_kill_matrix import oh


@pytest.mark.slow
@pytest.mark.parametrize("seeds", [2, pytest.param(10, marks=pytest.mark.scheduled)])
def test_correct_engine_passes_every_suite(tmp_path, seeds):
    # 2 seeds in .ci/run (4 took 194 s of its 20-minute budget on a cold 2-core run, 2026-12-05),
    # 10 in the scheduled tier; `check --seeds 200` is the long sweep
    junit = tmp_path / "check.xml"
    r = oh("check", "--seeds", str(seeds), "--junit", str(junit))
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "PASS" in r.stdout and junit.exists()


def test_check_fails_with_a_fault_and_refuses_unknown_ones():
    r = oh("check", "--fault", "no_fence", "--suite", "test_war_slot_table", "--suite", "test_fence_placement")
    assert r.returncode == 1 and "FAIL" in r.stdout and "WAR hazard on req_to_token" in r.stdout
    assert {ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith("test_")} == \
        {"test_war_slot_table", "test_fence_placement"}, r.stdout  # only the suites asked for
    r = oh("check", "--suite", "nosuch")
    assert r.returncode == 2 and r.stderr.strip().startswith("overlap-harness: error: unknown suite 'nosuch'")
    r = oh("check", "--fault", "nosuch")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "known: no_fence" in r.stderr
