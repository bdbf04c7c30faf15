"""What the conservation oracle costs (issue 23): `check`'s wall time on the ref engine with
the oracle on vs off, side by side in one process, one run each. Goal: on / off under 1.02.

    .venv/bin/python benchmarks/bench_conservation.py            # the gate, both arms (about 3 min, 2 cores)
    .venv/bin/python benchmarks/bench_conservation.py --engine   # only the per-step books: the suite's cases, on vs off

The oracle is two parts: the test_conservation suite's own runs, and the engine's books
checked after every step and at idle in every run of every suite. The gate arms run as
`check` does (pytest-xdist, --workers auto) with and without the suite; the books cannot be
turned off in xdist's worker processes (the switch is a module constant, not a user
switch), so --engine times them alone, books on vs off over the same runs, in this process.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.engine import books  # noqa: E402

SUITE = "test_conservation"


def every_suite_but(name: str) -> list[str]:
    return sorted({p.stem for d in ("races", "equivalence", "evals") for p in (ROOT / d).glob("test_*.py")}
                  - {name})


def gate(on: bool, workers) -> tuple[float, dict]:
    from harness.gate import run_suites
    res = run_suites("ref", suites=None if on else every_suite_but(SUITE), workers=workers)
    passed = sum(s.passed for s in res.suites.values())
    failed = sum(s.failed for s in res.suites.values())
    return res.seconds, {"passed": passed, "failed": failed}


def engine(repeats: int) -> dict:
    """The per-step books alone: every case of the suite, overlap on and off, books on vs off."""
    from harness.targets.ref import RefTarget
    from races.test_conservation import CASES
    t = RefTarget()
    tok = t.tokenizer()
    times = {True: 0.0, False: 0.0}
    for _ in range(repeats):
        for on in (False, True):  # alternated, so drift on a shared machine hits both arms
            books.CHECK_EVERY_STEP = on
            t0 = time.perf_counter()
            for name in sorted(CASES):
                reqs, kw, _ = CASES[name](tok, 0)
                for overlap in (True, False):
                    t.run(reqs, overlap=overlap, **kw)
            times[on] += time.perf_counter() - t0
    books.CHECK_EVERY_STEP = True
    return {"books_on_s": round(times[True], 2), "books_off_s": round(times[False], 2),
            "ratio": round(times[True] / times[False], 4), "suite_runs_s": round(times[True] / repeats, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", action="store_true", help="only the per-step books over the suite's cases")
    ap.add_argument("--repeats", type=int, default=3, help="--engine: rounds of both arms")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.engine:
        out = engine(a.repeats)
        line = (f"books on {out['books_on_s']} s vs off {out['books_off_s']} s over {a.repeats} rounds of the "
                f"suite's cases: ratio {out['ratio']:.3f}")
    else:
        from harness.flags import worker_count
        workers = worker_count("auto")
        off_s, off = gate(False, workers)
        on_s, on = gate(True, workers)
        out = {"check_on_s": round(on_s, 1), "check_off_s": round(off_s, 1), "ratio": round(on_s / off_s, 4),
               "on": on, "off": off}
        line = (f"check (--workers {workers}) with the conservation suite {on_s:.1f} s ({on['passed']} passed) vs "
                f"without {off_s:.1f} s ({off['passed']} passed): ratio {on_s / off_s:.3f} (goal < 1.02)")
    print(json.dumps(out) if a.json else line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
