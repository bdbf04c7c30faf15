"""Overhead of the hazard detector: the same tiny-model engine workload with and
without an AccessTracker attached, in one run, printed as a ratio (target <= 2x).

    .venv/bin/python benchmarks/bench_detector.py [--reps N] [--requests N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from harness.device import make_device  # noqa: E402
from harness.engine.config import TINY, EngineConfig  # noqa: E402
from harness.engine.loop import Engine  # noqa: E402
from harness.engine.model import Model, init_tiny_weights  # noqa: E402
from harness.engine.request import Request  # noqa: E402
from harness.engine.tokenizer import ByteTokenizer  # noqa: E402
from harness.hazards.tracking import AccessTracker  # noqa: E402

TOK = ByteTokenizer()
WEIGHTS = init_tiny_weights(TINY, 0)


def workload(n: int) -> list[Request]:
    sysp = [TOK.bos_id] + TOK.encode("You are a helpful assistant. Answer briefly and precisely. ")
    reqs = []
    for i in range(n):
        p = sysp + TOK.encode(f"Q{i}?") if i % 2 else [TOK.bos_id] + TOK.encode(f"x{i} " * (1 + i % 3))
        reqs.append(Request(f"r{i}", p, max_new_tokens=4 + (i * 5) % 9, arrival=i // 4))
    return reqs


def run_once(track: bool, n: int) -> tuple[float, float, int, int]:
    """(wall s, process CPU s, steps, hazards) of one engine run."""
    cfg = EngineConfig(overlap=True, policy="serial", max_running=4)
    c = cfg.costs
    dev = make_device("sim", cfg.policy, 0, c.launch_ms / c.launches_per_step)
    eng = Engine(cfg, TINY, Model(TINY, WEIGHTS, dev.torch_device), dev, TOK.decode)
    tr = None
    if track:
        dev.tracker = tr = AccessTracker(dev)
    t, c = time.perf_counter(), time.process_time()
    eng.run(workload(n))
    nh = len(tr.hazards) if tr is not None else 0  # the report is part of the cost
    return time.perf_counter() - t, time.process_time() - c, eng.steps, nh


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--requests", type=int, default=12)
    a = ap.parse_args()
    torch.set_num_threads(1)
    run_once(True, 2)  # warm up (the dispatch-mode machinery imports on first use)
    run_once(False, 2)
    plain, tracked, plain_cpu, tracked_cpu = [], [], [], []
    for _ in range(a.reps):  # interleaved, best of reps: robust to a busy machine
        dt, cpu, steps, _ = run_once(False, a.requests)
        plain.append(dt)
        plain_cpu.append(cpu)
        dt, cpu, _, nh = run_once(True, a.requests)
        tracked.append(dt)
        tracked_cpu.append(cpu)
    p, t = min(plain), min(tracked)
    print(f"steps={steps} hazards={nh} plain={p * 1e3:.1f}ms tracked={t * 1e3:.1f}ms "
          f"ratio={t / p:.2f}x wall (target <= 2x); cpu ratio={min(tracked_cpu) / min(plain_cpu):.2f}x")
    schedules_per_minute()


def schedules_per_minute(seconds: float = 20.0) -> None:
    """How many schedules the provoked-corruption suite explores per minute: each is one
    engine run of one of its scenarios under one of its policies."""
    from harness.targets.ref import RefTarget
    from races.scenarios import SCENARIOS
    from races.test_provoked_corruption import policies
    t = RefTarget()
    tok = t.tokenizer()
    n, start, seed = 0, time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        for name, make in SCENARIOS.items():
            reqs, kw, _ = make(tok, seed)
            for pol in policies(seed):
                t.run(reqs, overlap=True, policy=pol, **kw)
                n += 1
        seed += 1
    dt = time.perf_counter() - start
    print(f"provoked corruption: {n} schedules in {dt:.0f} s = {60 * n / dt:.0f} schedules/min "
          f"({len(SCENARIOS)} scenarios x 5 policies per seed)")


if __name__ == "__main__":
    main()
