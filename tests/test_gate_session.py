"""The suites' session in the caller's process (harness/gate/session.py): the caller's objects are
frozen for the garbage collector while it runs and given back after; the session's own cyclic
garbage is still collected."""
import gc
import weakref

from harness.gate.session import old_objects_frozen


def test_the_callers_objects_are_frozen_during_the_session_and_given_back():
    class Node:
        pass

    before = gc.get_freeze_count()
    with old_objects_frozen():
        assert gc.get_freeze_count() > before  # what the caller holds is out of the collector's walk
        cycle = Node()
        cycle.me = cycle  # garbage of the session's own: a cycle only the collector frees
        gone = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert gone() is None
    assert gc.get_freeze_count() == 0


def test_run_suites_holds_it_for_its_whole_session():
    """Each case of a real session (one suite, the ref engine) runs with the caller's objects frozen."""
    from harness.gate import run_suites
    seen = []
    res = run_suites("ref", suites=["test_fence_placement"], keyword="row_reuse",
                     progress=lambda suite, report: seen.append(gc.get_freeze_count()))
    assert res.exit_code == 0 and seen and min(seen) > 0, (res.exit_code, seen)
    assert gc.get_freeze_count() == 0
