"""The engine's own books: what each resource holds and who holds it (issue 23).

Every resource the engine allocates is accounted for after every processed step and is
back at idle, as SGLang's scheduler checks its pools whenever it idles. The invariants are
stated where each resource is defined:

- KV pages: memory.KVPool (free + cached + in use == total) and memory.PrefixCache (a
  node's refs are the running requests that lock it; a request's cached prefix is its
  nodes' pages);
- slot-table rows and relay entries: memory.Rows (free + running == total; 0 never handed out);
- host ring slots: loop.RING (the steps in flight hold distinct slots, at most RING);
- reserved windows: scheduler.Scheduler.reserve_windows (a request holds no more pages
  than its count asks n_windows windows ahead; speculative decoding reserves a window of
  k + 1 positions);
- scheduler entries: scheduler.Scheduler (waiting requests hold nothing, running ones a
  row, an entry and their pages, finished ones nothing; at idle nothing waits, runs or is
  in flight).

`unbalanced` is the per-step check: integer counts, O(running + waiting), no device
access. Only a resource whose counts do not add up is audited in full (`audit`: every unit
placed, the missing ones named with the request that took them), so a correct run pays
for the counts alone. `held` says what is held and by whom (the HANG report).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

from harness.engine.request import State

PAGES = "KV pages"
ROWS = "slot-table rows"
ENTRIES = "relay entries"
RING_SLOTS = "host ring slots"
WINDOWS = "reserved windows"
ENTRIES_SCHED = "scheduler entries"
RESOURCES = (PAGES, ROWS, ENTRIES, RING_SLOTS, WINDOWS, ENTRIES_SCHED)
CHECK_EVERY_STEP = True  # benchmarks/bench_conservation.py turns it off to time the check; not a user switch
SHOWN = 3  # units named per finding


@dataclass(frozen=True)
class Finding:
    resource: str  # one of RESOURCES
    step: int  # the step whose processing found it (at idle: the last step)
    holder: str  # the request that holds what was not returned, as "rid (state)"; "" if none is known
    what: str

    def __str__(self) -> str:
        return f"{self.resource}: {self.what} (step {self.step})"


class Books:
    """The per-step and idle checks of one engine; findings are kept, one per resource (a
    leak unbalances every later step: the first says where it began)."""

    def __init__(self, eng):
        self.eng = eng
        self.findings: list[Finding] = []
        self.flagged: set[str] = set()
        self.idle_checked = False

    def after_process(self, b) -> None:
        if not CHECK_EVERY_STEP:
            return
        bad = [r for r in unbalanced(self.eng, b) if r not in self.flagged]
        for res in bad:
            self._add(audit(self.eng, res, b.step, batch=b) or
                      [Finding(res, b.step, "", "the counts do not add up: " + counts_line(self.eng, res))])

    def at_idle(self) -> None:
        """Everything back: every request finished or aborted, no step in flight, every cached
        page evictable, every row, entry and page free or cached."""
        if not CHECK_EVERY_STEP:
            return
        self.idle_checked = True
        step = max(self.eng.steps - 1, 0)
        for res in RESOURCES:
            if res not in self.flagged:
                self._add(audit(self.eng, res, step, idle=True))

    def at_hang(self) -> None:
        """The run starved (the watchdog's HANG): audit every resource in full, once, so the HANG
        says where the leak began even when every per-step count still added up (a reference on
        a cached page that no request owns leaves the counts right and starves admission)."""
        step = max(self.eng.steps - 1, 0)
        for res in RESOURCES:
            if res not in self.flagged:
                self._add(audit(self.eng, res, step))

    def _add(self, found: list[Finding]) -> None:
        for f in found:
            if f.resource not in self.flagged:
                self.flagged.add(f.resource)
                self.findings.append(f)


# -- the per-step counts ---------------------------------------------------------------
def unbalanced(eng, b=None) -> list[str]:
    """Resources whose counts do not add up now (b: the step just processed)."""
    s = eng.sched
    pool, cache, run = s.pool, s.cache, s.running
    out = []
    in_use = locked = 0
    windows_ok = sched_ok = True
    for r in run:
        n = len(r.cached_nodes)
        in_use += len(r.pages) - n
        locked += n
        if len(r.pages) > s._pages_for(r.fill + s.n_windows * s.window):
            windows_ok = False
        if r.state is not State.RUNNING or r.row is None or r.entry is None:
            sched_ok = False
    if pool.free + cache.pages + in_use != pool.total or cache.locks != locked:
        out.append(PAGES)
    if s.rows.free + len(run) != s.rows.total or s.rows.first == 0:
        out.append(ROWS)
    if s.entries.free + len(run) != s.entries.total or s.entries.first == 0:
        out.append(ENTRIES)
    q = _in_flight(eng, b)
    if len(q) > eng.host_ring or len({x.ring % eng.host_ring for x in q}) != len(q):
        out.append(RING_SLOTS)
    if not windows_ok:
        out.append(WINDOWS)
    if sched_ok:
        sched_ok = all(r.state is State.WAITING and not r.pages and r.row is None and r.entry is None
                       for r in s.waiting)
    if sched_ok and b is not None:
        sched_ok = all(_holds_nothing(r) for r in b.reqs if r.state is State.FINISHED)
    if not sched_ok:
        out.append(ENTRIES_SCHED)
    return out


def _in_flight(eng, b=None) -> list:
    """The steps in flight together: the one just processed (its host slot was in use until now)
    and those still queued."""
    return ([b] if b is not None else []) + list(eng.queue)


def _holds_nothing(r) -> bool:
    return not r.pages and not r.cached_nodes and r.row is None and r.entry is None


def counts_line(eng, res: str) -> str:
    s = eng.sched
    if res == PAGES:
        in_use = sum(len(r.pages) - len(r.cached_nodes) for r in s.running)
        return (f"free {s.pool.free} + cached {s.cache.pages} + in use {in_use} = "
                f"{s.pool.free + s.cache.pages + in_use} of {s.pool.total}; locks {s.cache.locks}")
    alloc = {ROWS: s.rows, ENTRIES: s.entries}.get(res)
    if alloc is not None:
        return f"free {alloc.free} + running {len(s.running)} = {alloc.free + len(s.running)} of {alloc.total}"
    return f"{len(s.waiting)} waiting, {len(s.running)} running, {len(eng.queue)} step(s) in flight"


# -- the full audit --------------------------------------------------------------------
def _requests(eng) -> dict:
    s = eng.sched
    out = {}
    for r in chain(s.finished, (x for q in eng.queue for x in q.reqs), s.waiting, s.running):
        out[r.rid] = r  # the newest record of a rid last
    return out


def who(eng, rid, known=None) -> str:
    """A holder as "rid (state)"."""
    if rid is None:
        return "no one on record"
    r = (known if known is not None else _requests(eng)).get(rid)
    if r is None:
        return f"{rid} (no longer known to the scheduler)"
    if r.state is State.FINISHED:
        return f"{rid} (finished: {r.finish_reason})"
    extra = f", retracted {r.retractions} time(s)" if r.retractions else ""
    if r.state is State.WAITING:
        return f"{rid} (waiting{extra})"
    return f"{rid} (running, row {r.row}, entry {r.entry}{extra})"


def audit(eng, res: str, step: int, batch=None, idle: bool = False) -> list[Finding]:
    fn = {PAGES: _audit_pages, ROWS: _audit_rows, ENTRIES: _audit_entries, RING_SLOTS: _audit_ring,
          WINDOWS: _audit_windows, ENTRIES_SCHED: _audit_sched}[res]
    return fn(eng, step, batch, idle)


def _units(missing: list[int], holder, name: str) -> str:
    shown = ", ".join(f"{name} {u} (taken by {holder(u)})" for u in missing[:SHOWN])
    return shown + (f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else "")


def _audit_pages(eng, step, batch, idle) -> list[Finding]:
    s = eng.sched
    pool, cache = s.pool, s.cache
    known = _requests(eng)
    out = []
    place: dict[int, str] = {}
    twice = []

    def put(p, where):
        if p in place:
            twice.append((p, place[p], where))
        else:
            place[p] = where
    for p in pool.free_pages():
        put(p, "the free list")
    nodes = cache.nodes()
    for n in nodes:
        put(n.page, "the prefix cache")
    lockers: dict[int, int] = {}
    for r in s.running:
        mine, cached = r.pages[:len(r.cached_nodes)], [n.page for n in r.cached_nodes]
        for n in r.cached_nodes:
            lockers[id(n)] = lockers.get(id(n), 0) + 1
        for i, (a, c) in enumerate(zip(mine, cached)):
            if a != c:
                ps = pool.page_size
                out.append(Finding(PAGES, step, who(eng, r.rid, known),
                                   f"{r.rid}'s row points at its own page {a} at positions {i * ps}..{(i + 1) * ps - 1}, "
                                   f"where it locks the cached page {c}: its copy counts as cached, so it is "
                                   f"never freed"))
                break
        for p in r.pages[len(r.cached_nodes):]:
            put(p, r.rid)
    if 0 in place:
        out.append(Finding(PAGES, step, "", f"page 0 (padding) is in {place[0]}"))
    missing = [p for p in range(1, pool.num_pages) if p not in place]
    if missing:
        first = pool.holder[missing[0]]
        out.append(Finding(PAGES, step, who(eng, first, known),
                           f"{len(missing)} of {pool.total} not returned: neither free, cached nor a running "
                           f"request's ({counts_line(eng, PAGES)}): "
                           + _units(missing, lambda p: who(eng, pool.holder[p], known), "page")))
    for p, a, b in twice[:1]:
        out.append(Finding(PAGES, step, b if b in known else "", f"page {p} is in {a} and held by {b}"
                           if b in known else f"page {p} is in {a} and in {b}"))
    bad = [n for n in nodes if n.refs != lockers.get(id(n), 0)]
    if bad:
        # a node's refs are its running lockers; one more is a reference no request owns: the
        # page is never evictable again (at idle: a cached page no request will ever release)
        n = bad[0]
        have = lockers.get(id(n), 0)
        extra = (f": {n.refs - have} reference(s) no request owns" if n.refs > have else
                 f": {have - n.refs} lock(s) released twice")
        more = f" ({len(bad)} such cached pages)" if len(bad) > 1 else ""
        out.append(Finding(PAGES, step, "", f"cached page {n.page} has {n.refs} lock(s) but "
                           f"{have} running request(s) hold it{extra}{more}"))
    elif cache.locks != sum(lockers.values()):
        out.append(Finding(PAGES, step, "", f"the cache counts {cache.locks} lock(s), its nodes "
                           f"{sum(n.refs for n in nodes)}, the running requests {sum(lockers.values())}"))
    if idle and not out and cache.evictable() != cache.pages:
        out.append(Finding(PAGES, step, "", f"at idle {cache.pages - cache.evictable()} cached page(s) "
                           f"are not evictable"))
    return out[:1]


def _audit_alloc(eng, step, res, alloc, attr, name) -> list[Finding]:
    s = eng.sched
    known = _requests(eng)
    place: dict[int, str] = {}
    out = []
    for i in alloc.free_list():
        if i in place:
            out.append(Finding(res, step, "", f"{name} {i} is on the free list twice"))
        place[i] = "free"
    for r in s.running:
        i = getattr(r, attr)
        if i is None:
            continue
        if i in place:
            other = place[i]
            out.append(Finding(res, step, who(eng, r.rid, known),
                               f"{name} {i} is held by {r.rid} and " + ("on the free list" if other == "free"
                                                                       else f"by {other}")))
        place[i] = r.rid
    if alloc.first == 0:  # 0 belongs to no request: padded rows read and write it
        held0 = f", now held by {who(eng, place[0], known)}" if place.get(0, "free") != "free" else ""
        out.append(Finding(res, step, who(eng, place[0], known) if held0 else "",
                           f"{name} 0 (padding) is handed out like any other{held0}"))
    missing = [i for i in range(alloc.first, alloc.n + 1) if i not in place]
    if missing:
        first = alloc.holder.get(missing[0])
        out.insert(0, Finding(res, step, who(eng, first, known),
                              f"{len(missing)} of {alloc.total} not returned: neither free nor a running "
                              f"request's ({counts_line(eng, res)}): "
                              + _units(missing, lambda i: who(eng, alloc.holder.get(i), known), name)))
    return out[:1]


def _audit_rows(eng, step, batch, idle):
    return _audit_alloc(eng, step, ROWS, eng.sched.rows, "row", "row")


def _audit_entries(eng, step, batch, idle):
    return _audit_alloc(eng, step, ENTRIES, eng.sched.entries, "entry", "entry")


def _audit_ring(eng, step, batch, idle):
    q, n = _in_flight(eng, batch), eng.host_ring
    if idle and q:
        return [Finding(RING_SLOTS, step, "", f"at idle {len(q)} step(s) are still in flight "
                        f"(steps {', '.join(str(x.step) for x in q)})")]
    slots: dict[int, int] = {}
    for x in q:
        if x.ring % n in slots:
            return [Finding(RING_SLOTS, step, "", f"steps {slots[x.ring % n]} and {x.step} are in flight "
                            f"together and both hold host slot {x.ring % n}")]
        slots[x.ring % n] = x.step
    if len(q) > n:
        return [Finding(RING_SLOTS, step, "", f"{len(q)} steps in flight, {n} host slots")]
    return []


def _audit_windows(eng, step, batch, idle):
    s = eng.sched
    for r in s.running:
        want = s._pages_for(r.fill + s.n_windows * s.window)
        if len(r.pages) > want:
            return [Finding(WINDOWS, step, who(eng, r.rid),
                            f"{r.rid} holds {len(r.pages)} pages, {len(r.pages) - want} past its reservation "
                            f"({s.n_windows} window(s) of {s.window} past its count {r.fill}: {want} pages)")]
    return []


def _audit_sched(eng, step, batch, idle):
    s = eng.sched
    known = _requests(eng)
    for r in s.running:
        if r.state is not State.RUNNING or r.row is None or r.entry is None:
            return [Finding(ENTRIES_SCHED, step, who(eng, r.rid, known),
                            f"{r.rid} is in the running set as {r.state.value}, row {r.row}, entry {r.entry}")]
    for r in s.waiting:
        if r.state is not State.WAITING or not _holds_nothing(r):
            return [Finding(ENTRIES_SCHED, step, who(eng, r.rid, known),
                            f"{r.rid} waits ({r.state.value}) holding row {r.row}, entry {r.entry}, "
                            f"{len(r.pages)} page(s)")]
    done = [r for r in (batch.reqs if batch is not None else ()) if r.state is State.FINISHED]
    if idle:
        done += list(s.finished)
    for r in done:
        if not _holds_nothing(r):
            return [Finding(ENTRIES_SCHED, step, who(eng, r.rid, known),
                            f"{r.rid} finished ({r.finish_reason}) still holding row {r.row}, entry {r.entry}, "
                            f"{len(r.pages)} page(s), {len(r.cached_nodes)} cache lock(s)")]
    if idle and (s.waiting or s.running):
        return [Finding(ENTRIES_SCHED, step, "", f"at idle {len(s.waiting)} request(s) wait and "
                        f"{len(s.running)} run")]
    return []


# -- the HANG report ------------------------------------------------------------------
def held(eng) -> str:
    """What is held and by whom, in one line: rows, entries, pages (private and cached)."""
    s = eng.sched
    known = _requests(eng)
    parts = []
    for res, alloc in ((ROWS, s.rows), (ENTRIES, s.entries)):
        taken = sorted(set(range(alloc.first, alloc.n + 1)) - set(alloc.free_list()))
        desc = ", ".join(f"{u} by {who(eng, alloc.holder.get(u), known)}" for u in taken[:SHOWN])
        more = f" and {len(taken) - SHOWN} more" if len(taken) > SHOWN else ""
        parts.append(f"{res} {len(taken)} of {alloc.total} held" + (f" ({desc}{more})" if taken else ""))
    free, cached = s.pool.free, s.cache.pages
    owners: dict[str, int] = {}
    cached_set = {n.page for n in s.cache.nodes()}
    free_set = set(s.pool.free_pages())
    for p in range(1, s.pool.num_pages):
        if p not in free_set and p not in cached_set:
            h = s.pool.holder[p]
            owners[h] = owners.get(h, 0) + 1
    desc = ", ".join(f"{n} by {who(eng, h, known)}" for h, n in sorted(owners.items(), key=lambda x: -x[1])[:SHOWN])
    refs = sum(n.refs for n in s.cache.nodes())  # the nodes' own references, not the cache's counter
    locks = f"{s.cache.locks} lock(s)" + (f", {refs} reference(s) on its nodes" if refs != s.cache.locks else "")
    parts.append(f"{PAGES} {s.pool.total - free - cached} of {s.pool.total} held"
                 + (f" ({desc})" if desc else "") + f", {cached} cached ({locks})")
    return "; ".join(parts)
