"""Did the run give back everything it took? (issue 23)

Every resource the ref engine allocates (KV pages with the prefix cache's references,
slot-table rows, relay entries, host ring slots, reserved windows, scheduler entries) is
accounted for after every processed step and is back at idle, overlap on and off. The
engine keeps its own books (harness/engine/books.py, the invariants stated where each
resource is defined); this oracle reads them. A finding names the resource, the step and
the request that holds what was not returned. A leak that starves admission does not run
on: the engine's watchdog ends the run as HANG (harness.engine.loop.EngineHang) with what
is held and by whom.
"""
from __future__ import annotations

from harness.engine.books import ENTRIES, PAGES, ROWS, Finding


def findings(eng) -> list[Finding]:
    """What the engine's books found, after every step and at idle. An engine driven by
    step() alone (the server) is checked at idle here, once it has no work."""
    if not eng.has_work() and not eng.books.idle_checked:
        eng.books.at_idle()
    return list(eng.books.findings)


def problems(eng) -> list[str]:
    return [str(f) for f in findings(eng)]


def books_line(eng) -> str:
    """The books as they stand, in one line (at idle: every row, entry and page free or cached)."""
    s = eng.sched
    in_use = sum(len(r.pages) - len(r.cached_nodes) for r in s.running)
    return (f"{PAGES}: free {s.pool.free} + cached {s.cache.pages} + in use {in_use} of {s.pool.total} "
            f"({s.cache.evictable()} evictable, {s.cache.locks} lock(s)); {ROWS}: {s.rows.free} of "
            f"{s.rows.total} free; {ENTRIES}: {s.entries.free} of {s.entries.total} free; "
            f"{len(s.waiting)} waiting, {len(s.running)} running, {len(eng.queue)} step(s) in flight")
