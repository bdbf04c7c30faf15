"""How fast `overlap-harness stress` finds each fault: per fault and mode, the share of seeds on
which it is found within the budget and the median time to detection (no shrinking).

Modes:
- full:            hazards + tokens + scheduler invariants, all schedule policies (stress's default)
- tokens:          token divergence only, all policies (serial, delay, pct, random)
- tokens-serial:   token divergence only, serial policy only: the baseline that almost never
                   shows corruption, since the bad order never happens

Target: >= 95% of seeds within 60 s for every ordering fault in the full mode.

    .venv/bin/python benchmarks/bench_stress.py --seeds 20 --budget 60 --modes full
    .venv/bin/python benchmarks/bench_stress.py --seeds 5 --budget 60 --modes tokens,tokens-serial
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.faults import CATALOGUE  # noqa: E402
from harness.search.explore import Stress  # noqa: E402
from harness.workloads.strategies import POLICY_KINDS  # noqa: E402

MODES = {
    "full": dict(detect="all", kinds=POLICY_KINDS),
    "tokens": dict(detect="tokens", kinds=POLICY_KINDS),
    "tokens-serial": dict(detect="tokens", kinds=("serial",)),
}


def measure(fault: str, mode: str, seeds, budget: float) -> dict:
    times, kinds = [], {}
    for seed in seeds:
        res = Stress(seconds=budget, seed=seed, faults={fault}, shrink=False, **MODES[mode]).run()
        if res.failed:
            times.append(res.first_found_s)
            k = res.first[1].kind
            kinds[k] = kinds.get(k, 0) + 1
    n = len(list(seeds))
    return {"fault": fault, "mode": mode, "seeds": n, "found": len(times), "share": len(times) / n,
            "median_s": statistics.median(times) if times else None, "max_s": max(times) if times else None,
            "kinds": kinds}


def table(rows) -> str:
    out = ["| fault | ordering | mode | found | median s | max s | detected as |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        med = f"{r['median_s']:.1f}" if r["median_s"] is not None else "-"
        mx = f"{r['max_s']:.1f}" if r["max_s"] is not None else "-"
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["kinds"].items())) or "-"
        out.append(f"| {r['fault']} | {'yes' if CATALOGUE[r['fault']].ordering else 'no'} | {r['mode']} | "
                   f"{r['found']}/{r['seeds']} ({100 * r['share']:.0f}%) | {med} | {mx} | {kinds} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--budget", type=float, default=60.0, help="seconds per seed (default 60)")
    p.add_argument("--modes", default="full", help=f"comma list of {', '.join(MODES)}")
    p.add_argument("--fault", action="append", default=[], help="only these faults (default: every ordering "
                   "fault plus penalty_from_cpu)")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    a = p.parse_args()
    faults = a.fault or [f for f, x in CATALOGUE.items() if x.ordering] + ["penalty_from_cpu"]
    seeds = range(a.first_seed, a.first_seed + a.seeds)
    rows = []
    t0 = time.monotonic()
    for mode in a.modes.split(","):
        for fault in faults:
            r = measure(fault, mode, seeds, a.budget)
            rows.append(r)
            print(f"{fault:26} {mode:14} {r['found']}/{r['seeds']}  median {r['median_s']}  "
                  f"({time.monotonic() - t0:.0f} s so far)", file=sys.stderr, flush=True)
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    full = [r for r in rows if r["mode"] == "full" and CATALOGUE[r["fault"]].ordering]
    if full:
        ok = all(r["share"] >= 0.95 for r in full)
        print(f"\nfull mode, every ordering fault found on >= 95% of seeds within {a.budget:g} s: "
              f"{'yes' if ok else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
