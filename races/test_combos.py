"""Mechanisms attacked together (issue 44, item 2): every pair of the ref engine's path features
(harness/workloads/combos.py: abort, prefix hit, retraction with a step in flight, seeded
sampling, penalties, stop strings, speculative decoding) meets on one request in a few request
mixes (a strength-2 covering array), overlap on and off, with the engine's books (every pool and
reference) checked after each step and at idle.

What met is read from the engine's counts, never from the plan; a pair the plan put together that
no request exercised fails the suite as `not exercised`. A books finding is named by its pair:
the pairs every failing case's suspects (the requests that ended or were retracted in the round
the books went wrong) met and no clean case met.
"""
import itertools
from collections import Counter
from functools import reduce

from harness.engine.loop import EngineHang
from harness.oracles.conservation import findings
from harness.workloads import combos
from races.scenarios import seeds

ARRAY = combos.plan()


class Watch:
    """The on_step hook of one case: aborts and retracts as planned, and keeps the requests that ended or were
    retracted in the round where the books first found something (the suspects)."""

    def __init__(self, plan: dict):
        self.drive = combos.drive(plan)
        self.seen: dict[str, tuple] = {}
        self.suspects: list | None = None

    def __call__(self, eng) -> None:
        changed = [r for r in self._requests(eng) if self.seen.get(r.rid) != (r.state, r.retractions)]
        if self.suspects is None and eng.books.findings:
            self.suspects = changed
        self.drive(eng)
        self.seen = {r.rid: (r.state, r.retractions) for r in self._requests(eng)}

    @staticmethod
    def _requests(eng):
        s = eng.sched
        return list(s.finished) + list(s.running) + list(s.waiting)


def run_case(target, reqs, kw, plan, overlap):
    """(engine, watch, the HANG line or "")."""
    watch = Watch(plan)
    try:
        return target.run(reqs, overlap=overlap, on_step=watch, **kw).engine, watch, ""
    except EngineHang as e:
        return e.engine, watch, str(e)


def pairs_of(eng, reqs) -> set:
    return set().union(*(combos.met(combos.observed(eng, r)) for r in reqs))


def fails(target, tok, on: set, seed: int, overlap: bool) -> bool:
    """Does a mix with only the features `on` set off the books (or HANG)?"""
    reqs, kw, plan = combos.mix(tok, {f: f in on for f in combos.FEATURES}, seed)
    eng, _, hang = run_case(target, reqs, kw, plan, overlap)
    return bool(hang or findings(eng))


def name_pairs(target, tok, failing: list, clean: set) -> str:
    """The pairs every failing case's suspects met that no clean case met (else those every
    failing case met), each run again alone (a mix with only its two features on, as the first
    failing case ran): the ones that still fail are named, the others marked "(not alone)"."""
    common = reduce(set.intersection, (pairs for _, pairs, _, _ in failing))
    named = sorted((common - clean) or common)
    if not named:
        alone = reduce(set.intersection, (set(f for p in pairs for f in p) for _, pairs, _, _ in failing))
        return (" and ".join(sorted(alone)) or "no feature in common") + " (no pair: one mechanism alone)"
    _, _, seed, overlap = failing[0]
    alone = [p for p in named if fails(target, tok, set(p), seed, overlap)]
    return ", ".join([combos.pair_name(p) for p in alone] +
                     [combos.pair_name(p) + " (not alone)" for p in named if p not in alone])


def test_pairs_meet_and_books_balance(target, tok, oh_options, record_property):
    met: Counter = Counter()  # pair -> requests that met it, overlap on (met_off: off)
    met_off: Counter = Counter()
    clean: set = set()
    failing = []  # (case, the suspects' pairs, seed, overlap)
    firsts = []  # each failing case's first finding and its step
    for seed in seeds(oh_options, 1):
        for k, row in enumerate(ARRAY.rows):
            reqs, kw, plan = combos.mix(tok, row, seed)
            on = "+".join(f for f, v in row.items() if v) or "none"
            for overlap in (True, False):
                case = f"row {k} ({on}), seed {seed}, overlap {'on' if overlap else 'off'}"
                eng, watch, hang = run_case(target, reqs, kw, plan, overlap)
                everyone = Watch._requests(eng)
                for r in everyone:
                    (met if overlap else met_off).update(combos.met(combos.observed(eng, r)))
                bad = findings(eng)
                if bad or hang:
                    suspects = watch.suspects if watch.suspects else everyone
                    failing.append((case, pairs_of(eng, suspects), seed, overlap))
                    firsts.append((str(bad[0]) if bad else hang, bad[0].step if bad else eng.steps))
                else:
                    clean |= pairs_of(eng, everyone)
    planned = combos.planned_pairs(ARRAY)
    for p in itertools.combinations(combos.FEATURES, 2):
        n = (f"{met[p]}/{met_off[p]}" if met[p] + met_off[p] else "not exercised") if p in planned else "n/a"
        record_property("pairs_met", f"{combos.pair_name(p)}={n}")
    met += met_off
    if failing:
        record_property("first_step", firsts[0][1])
        assert not failing, (f"{name_pairs(target, tok, failing, clean)}: {firsts[0][0]} ({failing[0][0]}; "
                             f"{len(failing)} failing case(s) "
                             f"of {2 * len(ARRAY.rows) * len(seeds(oh_options, 1))})")
    missing = sorted(planned - set(met))
    assert not missing, "not exercised: " + ", ".join(combos.pair_name(p) for p in missing)
