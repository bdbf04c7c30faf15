"""GSM8K gate: throughput and statistical power.

1. Questions per minute through lm-eval's gsm8k task, in-process (the `overlap-ref` model)
   vs through `overlap-harness serve` with lm-eval's local-completions client, overlap on.
2. The smallest accuracy drop the paired test (one-sided exact McNemar, alpha 0.05, power
   0.8) detects at n = 1319 for a given rate of discordant questions, next to the unpaired
   one-sided threshold used elsewhere (4.84 points at n = 1319, sigma = 50 points).

    .venv/bin/python benchmarks/bench_gsm8k.py [--questions 60] [--model arith] [--stats-only]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.oracles import stats as S  # noqa: E402


def power_table(n: int = 1319) -> str:
    rows = [f"minimum detectable drop at n = {n}, alpha = 0.05 one-sided, power 0.8",
            f"{'discordant':>11}  {'paired exact':>12}  {'paired normal':>13}  {'unpaired':>9}"]
    un = 100 * S.mde_unpaired(n, 0.5)
    for d in (0.005, 0.01, 0.02, 0.05, 0.10, 0.20):
        ex, nm = S.mde_paired_exact(n, d), S.mde_paired_normal(n, d)
        exs = "not reachable" if ex != ex else f"{100 * ex:.2f} pts"
        rows.append(f"{100 * d:>10.1f}%  {exs:>12}  {100 * nm:>9.2f} pts  {un:>5.2f} pts")
    rows.append("(discordant: questions right with one setting and wrong with the other; a correct "
                "overlap engine with greedy decoding has none)")
    return "\n".join(rows)


def throughput(model: str, n: int) -> str:
    from harness.engine.config import EngineConfig
    from harness.serve import make_server
    from harness.evals.gsm8k import make_task, resolve_data, run_side
    from harness.evals.lm import OverlapRefLM
    from harness.evals.run import make_lm, GateOptions
    tmp = Path(tempfile.mkdtemp())
    data = tmp / "q.jsonl"
    from fixtures.arith import problems
    problems.write_jsonl(data, problems.heldout(n))
    task = make_task(resolve_data(str(data), None, 0), 0)
    kw = {"max_context": 1024} if model == "tiny" else {}
    mgt = 32 if model == "tiny" else 256
    rows = [f"questions per minute, {n} GSM8K-format questions, model {model}, overlap on, simulated device"]
    lm = OverlapRefLM(model=model, max_gen_toks=mgt, **kw)
    side = run_side(lm, task, n, "in-process")
    rows.append(f"  in-process (overlap-ref, one engine run): {60 * n / side.seconds:7.1f} q/min  "
                f"({side.seconds:.1f} s, accuracy {100 * side.accuracy['strict-match']:.1f}%)")
    for conc in (1, 16):
        srv = make_server(EngineConfig(model=model, **kw)).start()
        try:
            o = GateOptions(target="openai", url_on=srv.url, url_off=srv.url, concurrency=conc, max_gen_toks=mgt)
            t = time.perf_counter()
            side = run_side(make_lm(o, True, "server"), task, n, "server")
            secs = time.perf_counter() - t
        finally:
            srv.shutdown()
        rows.append(f"  server, local-completions, {conc:2d} concurrent: {60 * n / secs:7.1f} q/min  "
                    f"({secs:.1f} s, accuracy {100 * side.accuracy['strict-match']:.1f}%)")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=60)
    ap.add_argument("--model", default=None, help="arith (default when present) or tiny")
    ap.add_argument("--stats-only", action="store_true")
    a = ap.parse_args()
    print(power_table())
    if a.stats_only:
        return 0
    from harness.evals.gsm8k import lm_eval_available
    why = lm_eval_available()
    if why:
        print(f"throughput: skipped ({why})")
        return 0
    model = a.model
    if model is None:
        from harness.engine.build import ModelUnavailable, load_model
        try:
            load_model("arith")
            model = "arith"
        except ModelUnavailable:
            model = "tiny"
    print()
    print(throughput(model, a.questions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
