"""How the gate runs the suites' pytest session in its own process: xdist's arguments for a worker
count, and the caller's objects kept out of the garbage collector's way while the session runs."""
from __future__ import annotations

import contextlib
import gc
import sys


def xdist_args(workers) -> list[str]:
    """pytest-xdist's arguments for `workers` ("auto": every core; 1: one process, no xdist)."""
    if workers in (None, 1, "1"):
        return []
    import importlib.util
    if importlib.util.find_spec("xdist") is None:
        print("overlap-harness: pytest-xdist is not installed: the cases run in one process", file=sys.stderr)
        return []
    return ["-n", str(workers)]


@contextlib.contextmanager
def old_objects_frozen():
    """The caller's objects out of the collector's sight during the suites (gc.freeze), back after.
    pytest ends each session with full collections (to flush unraisable exceptions), and each walked
    every object the caller holds: in a test worker, with torch and every collected test module
    alive, 0.13 s a collection, two a session, a third of the kill matrix's 30 sessions' CPU
    (measured). What the suites leave behind is still collected: nothing frozen is theirs."""
    if gc.get_freeze_count():  # the caller froze its own (a test worker): unfreezing would undo that
        yield
        return
    gc.collect()  # what is garbage already goes now, not into the frozen generation
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
