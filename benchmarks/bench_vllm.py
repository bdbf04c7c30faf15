"""vLLM as a target: what our agent costs, how fast each vLLM fault is found, peak memory.

Side by side in one run, on the same workload sent alternately:
- vLLM with no agent at all vs vLLM with our agent loaded but idle (a plan with no delays and
  no faults); both with async scheduling off, since vLLM's CPU platform cannot run it on
  without the agent (goal: the agent costs under 2% of tok/s);
- vLLM with async scheduling on (the agent keeps it on and runs the copy thread), for scale;
- for each vLLM fault, the wall time of the one run (plus its overlap-off twin) that finds it;
- peak RSS of each server's process tree, sampled with psutil.
"""
from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from harness.workloads import presets as workloads  # noqa: E402
from harness.oracles.divergence import record_problems, run_logprobs  # noqa: E402
from harness.oracles.reference import divergences  # noqa: E402
from harness.targets.vllm.target import VllmTarget  # noqa: E402

ROUNDS = 5


class NoAgent(VllmTarget):
    """The baseline: vLLM exactly as a user runs it, without our plan (the agent stays inert)."""
    agent_env = None

    def check_overlap(self, overlap, facts, after_run):
        pass  # nothing reports facts here: the baseline is async off, as vLLM's CPU platform sets it


def tree_rss(pid: int) -> int:
    try:
        p = psutil.Process(pid)
        return sum(q.memory_info().rss for q in [p] + p.children(recursive=True))
    except psutil.Error:
        return 0


class PeakRSS:
    def __init__(self, pids):
        self.pids, self.peak, self._stop = pids, {pid: 0 for pid in pids}, threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while not self._stop.is_set():
            for pid in self.pids:
                self.peak[pid] = max(self.peak[pid], tree_rss(pid))
            time.sleep(0.2)

    def stop(self):
        self._stop.set()
        return self.peak


def tokens(run) -> int:
    return sum(len(ids) for _, ids, _ in run.outputs)


def workload(tok, n=16):
    reqs = workloads.mixed(tok, n, seed=1)
    for r in reqs:
        r.max_new_tokens, r.stop, r.abort_after, r.arrival = 64, (), None, 0
    return reqs


def main() -> int:
    from harness.targets.base import TargetUnavailable
    try:
        base, agent = NoAgent(), VllmTarget()
    except TargetUnavailable as e:
        print(f"bench_vllm: skipped: {e}")
        return 0
    t0 = time.perf_counter()
    base.start(which=(False,))
    agent.start()
    print(f"servers ready in {time.perf_counter() - t0:.0f} s", flush=True)
    tok = agent.tokenizer()
    reqs = workload(tok)
    pids = {"no agent (async off)": base.servers[False].proc.pid, "agent idle (async off)": agent.servers[False].proc.pid,
            "agent (async on)": agent.servers[True].proc.pid}
    rss = PeakRSS(list(pids.values()))
    rates = {k: [] for k in pids}
    for _ in range(ROUNDS):  # alternate, so load on the shared machine falls on all three alike
        for label, (t, overlap) in (("no agent (async off)", (base, False)), ("agent idle (async off)", (agent, False)),
                                    ("agent (async on)", (agent, True))):
            run = t.run(reqs, overlap=overlap)
            rates[label].append(tokens(run) / run.summary["seconds"])
    peak = rss.stop()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("\nthroughput, 16 requests x 64 tokens, float32, eager (median of %d rounds)" % ROUNDS)
    for k in rates:
        print(f"  {k:24} {med[k]:7.1f} tok/s   peak RSS {peak[pids[k]] / 2**30:.2f} GiB")
    print(f"  agent idle / no agent:   {med['agent idle (async off)'] / med['no agent (async off)']:.3f}  (goal >= 0.98)")
    print(f"  async on / async off:    {med['agent (async on)'] / med['agent idle (async off)']:.3f}")
    base.close()

    print("\ntime to detect each vLLM fault (one faulty run and its overlap-off twin)")
    cases = [("penalty_stale_output_ids", None, True), ("sampled_ids_no_wait", {"output_copy": {"p": 0.5, "ms": 5}}, False),
             ("pinned_buffer_reuse", {"before_wait": {"p": 1.0, "steps": 2}}, False)]
    for fault, delays, penalty in cases:
        rq = workload(tok, 10)
        for i, r in enumerate(rq):
            r.max_new_tokens = 16
            if penalty and i % 2 == 0:
                r.repetition_penalty = 1.3
        t1 = time.perf_counter()
        off = agent.run(rq, overlap=False)
        bad = agent.run(rq, overlap=True, faults=[fault], delays=delays or {})
        found = [d for _, _, ds in divergences(off, bad) for d in ds if not d.near_tie] or \
            record_problems(bad.outputs, run_logprobs(bad))
        print(f"  {fault:26} {'found' if found else 'MISSED'} in {time.perf_counter() - t1:5.1f} s")
    agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
