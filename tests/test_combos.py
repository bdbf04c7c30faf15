"""Mechanisms attacked together (issue 44, item 2): the covering arrays cover every pair, the
ref engine's mixes realise the pairs they plan (read from the engine's counts), and the suite
races/test_combos catches the fault that lives where two meet (abort x prefix_hit), names the
pair, stays quiet on the correct engine and says `not exercised` when a pair never ran."""
import itertools

import pytest

from harness.gate import run_suites
from harness.targets.ref import RefTarget
from harness.workloads import combos
from harness.workloads.covering import all_pairs, pairwise


def pairs_held(rows, factors) -> set:
    """Every value pair the rows hold, counted by brute force (independent of covering.row_pairs)."""
    out = set()
    for row in rows:
        for a, b in itertools.combinations(list(factors), 2):
            out.add(((a, row[a]), (b, row[b])))
    return out


CASES = {
    "binary 7": ({f"f{i}": (0, 1) for i in range(7)}, lambda r: True),
    "mixed levels": ({"a": (0, 1, 2), "b": ("x", "y"), "c": (0, 1, 2, 3), "d": (True, False)}, lambda r: True),
    "constrained": ({f"f{i}": (0, 1) for i in range(6)}, lambda r: not (r["f0"] and r["f1"]) and r["f2"] <= r["f3"]),
    "sampled": ({f"f{i}": tuple(range(3)) for i in range(9)}, lambda r: True),  # 3**9 > ENUMERATE_UP_TO
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_allowed_pair_is_covered(case):
    factors, allowed = CASES[case]
    arr = pairwise(factors, allowed)
    assert all(allowed(r) for r in arr.rows)
    held = pairs_held(arr.rows, factors)
    assert held | set(arr.impossible) == all_pairs(factors)
    assert not held & set(arr.impossible)
    if case != "constrained":
        assert not arr.impossible
    # a strength-2 array over k binary factors needs far fewer rows than the 2**k product
    assert len(arr.rows) < {"binary 7": 10, "mixed levels": 16, "constrained": 10, "sampled": 20}[case]
    assert pairwise(factors, allowed).rows == arr.rows  # deterministic


def test_impossible_pairs_are_exactly_the_constraints():
    arr = pairwise({f"f{i}": (0, 1) for i in range(4)}, lambda r: not (r["f0"] and r["f1"]))
    assert arr.impossible == ((("f0", 1), ("f1", 1)),)


def test_bad_factors_refused():
    with pytest.raises(ValueError):
        pairwise({"a": ()})


def test_the_ref_plan_covers_every_pair_the_engine_allows():
    arr = combos.plan()
    assert len(arr.rows) <= 8
    names = list(combos.FEATURES)
    every = set(itertools.combinations(names, 2))
    excluded = {p for p in every if frozenset(p) in combos.EXCLUSIVE}
    assert combos.planned_pairs(arr) == every - excluded
    assert {frozenset((a[0], b[0])) for a, b in arr.impossible if a[1] and b[1]} == set(combos.EXCLUSIVE)
    assert not set(combos.LACKING) & set(combos.FEATURES)


@pytest.fixture(scope="module")
def ref():
    t = RefTarget()
    return t, t.tokenizer()


def observe(ref, on: set, overlap=True):
    t, tok = ref
    reqs, kw, plan = combos.mix(tok, {f: f in on for f in combos.FEATURES}, 0)
    eng = t.run(reqs, overlap=overlap, on_step=combos.drive(plan), **kw).engine
    return {r.rid: combos.observed(eng, r) for r in eng.sched.finished}


@pytest.mark.parametrize("pair", [("abort", "prefix_hit"), ("retraction", "spec"), ("abort", "retraction")])
def test_a_pair_meets_on_one_request_from_the_engines_counts(ref, pair):
    seen = observe(ref, set(pair))
    assert any(set(pair) <= f for f in seen.values()), seen


def test_nothing_on_observes_nothing(ref):
    seen = observe(ref, set())
    assert not any(seen.values()), seen  # no retraction, no hit, no abort: the counts, not the plan


def test_suite_catches_abort_prefix_double_ref_and_names_the_pair():
    res = run_suites("ref", ("abort_prefix_double_ref",), 1, suites=["test_combos"])
    s = res.suites["test_combos"]
    assert s.failed == 1, s
    assert s.first_failure.startswith("abort x prefix_hit") and "reference(s) no request owns" in s.first_failure, \
        s.first_failure


def test_suite_quiet_on_the_correct_engine():
    res = run_suites("ref", (), 1, suites=["test_combos"])
    s = res.suites["test_combos"]
    assert res.exit_code == 0 and s.passed == 1 and s.failed == 0, (res.exit_code, s)
    # check's line: every pair with its requests (overlap on/off), the excluded ones n/a
    assert "abort x stop=n/a" in res.pairs and "penalty x spec=n/a" in res.pairs, res.pairs
    assert len(res.pairs) == 21 and not any("not exercised" in p for p in res.pairs), res.pairs


class NoRetraction:
    """A plugin that plans every retraction past the end of its request: every retraction pair goes unmet."""

    def pytest_configure(self, config):
        self.saved, combos.RETRACT_AT = combos.RETRACT_AT, 1 << 20

    def pytest_unconfigure(self, config):
        combos.RETRACT_AT = self.saved

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failure = report.longreprtext


def test_a_pair_that_never_ran_is_not_exercised():
    from harness.gate import ROOT
    args = [str(ROOT / "races" / "test_combos.py"), "-p", "no:cacheprovider", "-q", "--tb=line",
            "--rootdir", str(ROOT), "--oh-target", "ref"]
    plugin = NoRetraction()
    code = pytest.main(args, plugins=[plugin])
    assert code == 1
    assert "not exercised: abort x retraction" in plugin.failure, plugin.failure[-800:]
    assert combos.RETRACT_AT == 2  # restored
