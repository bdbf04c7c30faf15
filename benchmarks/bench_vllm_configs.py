"""Each server configuration of harness.targets.vllm.configs started on the vLLM in force, one pair
at a time: the seconds its pair takes to start (both servers at once, as every command starts them),
and a short mixed submission judged on it (the agent's overlap check before and after included),
so a configuration that vLLM refuses, or that starts without overlap, is measured, not assumed.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_vllm_configs.py [--configs all|NAME,...] [--json FILE]

Prints one line per configuration: started or the first line of why not, start seconds, judged.
Needs `overlap-harness setup vllm`.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def measure(name: str) -> dict:
    from harness import targets
    from harness.search.served.case import ServedCase
    from harness.search.served.judge import judge
    from harness.targets.vllm import workload as vllm_workload
    from harness.targets.base import TargetError, TargetUnavailable
    from harness.engine.request import Request
    row = {"config": name}
    t0 = time.perf_counter()
    pairs = targets.Pairs()
    try:
        t = pairs.get("vllm", config=name)
        t.start()
        row["start_s"] = round(time.perf_counter() - t0, 1)
        tok = t.tokenizer()
        reqs = []
        for i, (text, n) in enumerate((("The cache slot table", 8), (vllm_workload.PREFIX, 12),
                                       ("one two three " * 30, 6))):
            r = Request(rid=f"c0r{i}", prompt_ids=tok.encode(text)[:300], max_new_tokens=n)
            r.extra, r.n = {}, 1
            r.priority = i % 2 if t.config.priority else 0
            reqs.append(r)
        t1 = time.perf_counter()
        v = judge(t, ServedCase(reqs, {}, [], 1), t.version, True)
        row["judge_s"] = round(time.perf_counter() - t1, 1)
        row["verdict"] = "refused: " + v.refused if v.refused else ("FAIL: " + v.new[0].summary[:160] if v.failed
                                                                   else "pass")
    except (TargetUnavailable, TargetError, ValueError) as e:
        row["start_s"] = round(time.perf_counter() - t0, 1)
        row["verdict"] = "cannot start: " + (str(e).strip().splitlines() or ["?"])[0][:300]
    finally:
        pairs.close()
    return row


def main(argv=None) -> int:
    from harness.targets.vllm import configs as vllm_configs
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="all")
    p.add_argument("--json")
    a = p.parse_args(argv)
    names = list(vllm_configs.CONFIGS) if a.configs == "all" else vllm_configs.parse(a.configs, SystemExit)
    rows = []
    for n in names:
        c = vllm_configs.CONFIGS[n]
        if c.refused:
            rows.append({"config": n, "verdict": f"not started: {c.refused}"})
        else:
            rows.append(measure(n))
        r = rows[-1]
        print(f"{n:16} {c.flags():70} start {r.get('start_s', '-'):>6} s  {r['verdict']}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
