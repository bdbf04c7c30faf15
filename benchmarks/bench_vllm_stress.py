"""`stress --target vllm`: cases per minute on one warm server pair, batched (several independent
request mixes merged into one submission) vs one mix per submission, side by side in one run
(the same servers, the same seed, alternating, so the machine's load falls on both alike).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_vllm_stress.py [--minutes 1.5] [--batch 4] [--rounds 1]

Prints one line per side and the ratio (batched / single); `benchmarks/table.py --only vllm-stress`
puts the ratio in the bench table. Needs `overlap-harness setup vllm`.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rates(minutes: float = 1.5, batch: int = 4, rounds: int = 1, seed: int = 5) -> dict:
    """{"batched": cases/min, "single": cases/min, ...} measured on one warm pair."""
    from harness import targets
    from harness.search.served.explore import ServedStress
    pairs = targets.Pairs()
    t = pairs.get("vllm")
    t.start()
    tok = t.tokenizer()
    out = tempfile.mkdtemp(prefix="oh-bench-vllm-stress-")
    got = {"batched": [0, 0.0, 0], "single": [0, 0.0, 0]}
    try:
        for k in range(rounds):
            for side, cases in (("single", 1), ("batched", batch)):
                s = ServedStress(t, tok, seconds=60 * minutes, seed=seed + k, cases=cases, shrink_seconds=0, out=out,
                                 version=t.version)
                r = s.run()
                got[side][0] += r.cases
                got[side][1] += r.explore_s
                got[side][2] += r.runs
    finally:
        pairs.close()
        shutil.rmtree(out, ignore_errors=True)  # nothing is shrunk, so no reproducer is written there
    res = {side: 60 * c / s for side, (c, s, _) in got.items()}
    res["runs"] = {side: n for side, (_, _, n) in got.items()}
    res["ratio"] = res["batched"] / res["single"] if res["single"] else float("nan")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=1.5, help="search time per side and round (default 1.5)")
    ap.add_argument("--batch", type=int, default=4, help="mixes per submission on the batched side (default 4)")
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    r = rates(a.minutes, a.batch, a.rounds)
    print(f"batched ({a.batch} mixes a submission): {r['batched']:.1f} cases/min ({r['runs']['batched']} runs)")
    print(f"single (1 mix a submission):        {r['single']:.1f} cases/min ({r['runs']['single']} runs)")
    print(f"ratio batched / single: {r['ratio']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
