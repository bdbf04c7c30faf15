"""One table of every speed benchmark against its anchor, each pair measured side by side in
this run (the machine may be shared: absolute figures drift, ratios much less). `make bench`
prints it last.

    .venv/bin/python benchmarks/table.py [--quick] [--only smollm2,tiny,detector,stress,gate]

Rows (ratio > 1: ours / the subject is faster, except where the row says "x less"):
- SmolLM2 decode tok/s, batch 8, at max_context 256 and 1024 vs transformers `generate`
  (benchmarks/bench_smollm2.py's two sides, same weights, same threads), on process CPU time;
- tiny model, batch 8: decode steps/s with overlap on vs the 300 steps/s stress needs;
- detector: engine wall time with the access tracker vs without (the ratio is the overhead);
- stress: schedules/min of 2 shard processes (`stress --shard I/2`, as a CI matrix runs them)
  vs 1 process over the same minutes;
- gate: `overlap-harness check` wall time in one process vs `--workers 2` (pytest-xdist);
- vllm-stress (not in the default --only: it needs `setup vllm` and minutes): `stress --target vllm`
  cases/min with 4 request mixes merged into each submission vs one mix per submission, on one warm
  server pair (benchmarks/bench_vllm_stress.py).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

OH = [sys.executable, "-m", "harness.cli"]


def smollm2(context: int, new_tokens: int, repeats: int):
    import torch
    import bench_smollm2 as b
    from harness.engine.smollm2 import ModelUnavailable, hf_model, load_smollm2
    torch.set_num_threads(1)
    try:
        cfg, weights, tok = load_smollm2(max_context=context)
    except ModelUnavailable as e:
        return None, f"skipped: {e}"
    ref = hf_model(weights=weights)
    texts = [tok.apply_chat_template([{"role": "user", "content": q}]) for q in b.QUESTIONS]
    prompts = [tok.encode(t) for t in texts]
    sides = {"ours": b.ours(cfg, weights, prompts, new_tokens, context),
             "transformers": b.theirs(ref, tok, texts, cfg.pad_id)}
    for timed in sides.values():
        timed(2, 1)  # warm up
    rate = {}
    for name, timed in sides.items():  # the same prompts, back to back
        _, c1, _ = timed(1, repeats)
        _, cn, _ = timed(new_tokens, repeats)
        rate[name] = len(prompts) * (new_tokens - 1) / (cn - c1)
    return rate["ours"] / rate["transformers"], (f"{rate['ours']:.0f} vs {rate['transformers']:.0f} decode tok/CPU-s")


def tiny():
    from bench_engine import wall
    wall(8, 20)
    sps, _ = max(wall(overlap=True) for _ in range(2))
    return sps / 300, f"{sps:.0f} steps/s vs 300"


def detector(reps: int):
    import torch
    from bench_detector import run_once
    torch.set_num_threads(1)
    run_once(True, 2)
    run_once(False, 2)
    plain, tracked = [], []
    for _ in range(reps):  # interleaved, best of reps
        plain.append(run_once(False, 12)[0])
        tracked.append(run_once(True, 12)[0])
    return min(tracked) / min(plain), f"{1e3 * min(tracked):.0f} ms vs {1e3 * min(plain):.0f} ms"


def _stress_rate(minutes: float, shard: str, out: Path) -> subprocess.Popen:
    return subprocess.Popen(OH + ["stress", "--minutes", str(minutes), "--shard", shard, "--out", str(out),
                                  "--seed", "3"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def _schedules(p: subprocess.Popen) -> tuple[int, float]:
    err = p.communicate()[1]
    m = re.search(r"(\d+) schedules in ([\d.]+) s", err)
    if not m:
        raise RuntimeError(f"stress printed no summary: {err[-500:]}")
    return int(m.group(1)), float(m.group(2))


def stress(minutes: float, tmp: Path):
    n1, s1 = _schedules(_stress_rate(minutes, "0/1", tmp / "one"))
    procs = [_stress_rate(minutes, f"{i}/2", tmp / f"shard{i}") for i in range(2)]
    both = [_schedules(p) for p in procs]
    one = 60 * n1 / s1
    two = sum(60 * n / s for n, s in both)
    return two / one, f"{two:.0f} vs {one:.0f} schedules/min"


def gate():
    walls = {}
    for w in ("1", "2"):
        t = time.perf_counter()
        r = subprocess.run(OH + ["check", "--workers", w], cwd=ROOT, capture_output=True, text=True)
        walls[w] = time.perf_counter() - t
        if r.returncode != 0:
            return None, f"check --workers {w} exited {r.returncode}"
    return walls["1"] / walls["2"], f"{walls['2']:.0f} s vs {walls['1']:.0f} s wall"


def vllm_stress(minutes: float):
    from bench_vllm_stress import rates
    from harness.targets.vllm import setup as vllm_setup
    if vllm_setup.ready():
        return None, f"skipped: {vllm_setup.ready()}"
    r = rates(minutes)
    return r["ratio"], f"{r['batched']:.1f} vs {r['single']:.1f} cases/min"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs (noisier)")
    ap.add_argument("--only", default="smollm2,tiny,detector,stress,gate")
    a = ap.parse_args()
    only = set(a.only.split(","))
    import tempfile
    tmp = Path(tempfile.mkdtemp(prefix="oh-bench-"))
    rows = []
    plan = [
        ("smollm2", "SmolLM2 decode, max_context 256", "transformers generate", ">= 1.2",
         lambda: smollm2(256, 16 if a.quick else 32, 1 if a.quick else 2)),
        ("smollm2", "SmolLM2 decode, max_context 1024", "transformers generate", ">= 1.2",
         lambda: smollm2(1024, 16 if a.quick else 32, 1 if a.quick else 2)),
        ("tiny", "tiny steps/s, batch 8, overlap on", "300 steps/s (fixed)", ">= 1", tiny),
        ("detector", "detector: tracked / untracked wall", "untracked run", "<= 2 (x slower)",
         lambda: detector(3 if a.quick else 5)),
        ("stress", "stress schedules/min, 2 shards", "1 process", ">= 1.8",
         lambda: stress(0.25 if a.quick else 1.0, tmp)),
        ("gate", "check wall, --workers 2", "check in one process", ">= 1.67 (<= 0.6x time)", gate),
        ("vllm-stress", "vLLM stress cases/min, 4 mixes a run", "1 mix a run", ">= 2",
         lambda: vllm_stress(0.75 if a.quick else 1.5)),
    ]
    for key, what, anchor, goal, fn in plan:
        if key not in only:
            continue
        print(f"bench: {what} ...", file=sys.stderr, flush=True)
        try:
            ratio, detail = fn()
        except Exception as e:  # one broken row must not cost the table
            ratio, detail = None, f"error: {type(e).__name__}: {e}"[:120]
        rows.append((what, anchor, "-" if ratio is None else f"{ratio:.2f}x", goal, detail))
    head = ("benchmark", "anchor (same run)", "ratio", "goal", "figures")
    w = [max(len(r[i]) for r in rows + [head]) for i in range(5)]
    print()
    for r in [head, tuple("-" * x for x in w)] + rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
