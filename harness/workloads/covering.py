"""Covering arrays of strength 2: few rows in which every pair of factor values meets (issue 44).

Rows exercise mechanisms one at a time; bugs live where two meet (an abort of a request whose
prefix was a cache hit). A strength-2 covering array over the path features gives, in a handful
of rows, a row where each pair of features is on together, and rows where one is on and the other
off (the controls). Target-neutral: a factor is a name and its values; a served target's workload
can plan its request mixes with the same functions.

The construction is greedy (AETG's): among the allowed candidate rows, take the one that covers
the most value pairs not yet covered, until every allowed pair is; deterministic (ties go to the
first candidate in enumeration order). A pair no allowed row can hold (a constraint: the engine
refuses it) is returned apart, so a report can say n/a rather than "not exercised".
No third-party library: the project would take on a dependency for forty lines, and the tests
(tests/test_combos.py) prove the coverage of every array it builds.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Callable

ENUMERATE_UP_TO = 1 << 12  # candidate rows: the whole product up to this, else a seeded sample
SAMPLED = 512


@dataclass(frozen=True)
class CoveringArray:
    factors: tuple[str, ...]
    rows: tuple[dict, ...]  # factor -> value
    impossible: tuple[tuple, ...]  # ((f1, v1), (f2, v2)) pairs no allowed row holds

    def covers(self) -> set:
        return {p for row in self.rows for p in row_pairs(row, self.factors)}


def row_pairs(row: dict, factors) -> list[tuple]:
    """The value pairs a row holds: ((f1, v1), (f2, v2)) with f1 before f2 in `factors`."""
    return [((a, row[a]), (b, row[b])) for a, b in itertools.combinations(factors, 2)]


def all_pairs(factors: dict) -> set:
    names = tuple(factors)
    return {((a, va), (b, vb)) for a, b in itertools.combinations(names, 2)
            for va in factors[a] for vb in factors[b]}


def _candidates(factors: dict, allowed, seed: int) -> list[dict]:
    names = tuple(factors)
    size = 1
    for v in factors.values():
        size *= len(v)
    if size <= ENUMERATE_UP_TO:
        rows = (dict(zip(names, vals)) for vals in itertools.product(*factors.values()))
    else:
        rng = random.Random(seed)
        rows = ({n: rng.choice(factors[n]) for n in names} for _ in range(SAMPLED * len(names)))
    return [r for r in rows if allowed(r)]


def pairwise(factors: dict, allowed: Callable[[dict], bool] = lambda row: True, seed: int = 0) -> CoveringArray:
    """A strength-2 covering array over `factors` (name -> tuple of values) using only rows
    `allowed` accepts."""
    if not factors or any(not v for v in factors.values()):
        raise ValueError("every factor needs at least one value")
    names = tuple(factors)
    cands = _candidates(factors, allowed, seed)
    coverable = {p for r in cands for p in row_pairs(r, names)}
    todo = set(coverable)
    rows: list[dict] = []
    while todo:
        best = max(cands, key=lambda r: len(todo.intersection(row_pairs(r, names))))
        rows.append(best)
        todo.difference_update(row_pairs(best, names))
    impossible = tuple(sorted(all_pairs(factors) - coverable, key=str))
    return CoveringArray(names, tuple(rows), impossible)


def on_off_plan(features, exclusive=()) -> CoveringArray:
    """The rows over on/off features: every pair of feature values meets in one of them, and no row
    turns on both features of an `exclusive` pair (the ref engine's combos and vLLM's share this)."""
    return pairwise({f: (False, True) for f in features},
                    lambda row: not any(all(row.get(f) for f in pair) for pair in exclusive))


def planned_pairs(arr: CoveringArray) -> set[tuple[str, str]]:
    """The pairs of features some row turns on together (those must meet on a request)."""
    return {(a, b) for row in arr.rows for a, b in itertools.combinations(arr.factors, 2) if row[a] and row[b]}
