"""`overlap-harness gsm8k`: the nightly accuracy gate.

GSM8K through lm-eval's gsm8k task, overlap off then on over the same questions, judged by
the exact McNemar test on the discordant pairs. Exit codes: 0 pass, 1 a finding (silent accuracy
loss, or the arms differ either way), 2 bad input, 3 the target failed mid-run (not an accuracy
result), 4 inconclusive.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.jsonl import records

EXIT_PASS, EXIT_LOSS, EXIT_BAD, EXIT_FAILED, EXIT_INCONCLUSIVE = 0, 1, 2, 3, 4
DEFAULT_HISTORY = "out/gsm8k/history.jsonl"


def _progress(stream=None):
    stream = stream or sys.stderr
    tty = stream.isatty()
    last = {}

    def show(label, done, total):
        if tty:
            stream.write(f"\r{label}: {done}/{total} questions")
            if done == total:
                stream.write("\n")
        else:
            step = max(1, total // 10)
            if done == total or done // step != last.get(label, -1):
                last[label] = done // step
                stream.write(f"{label}: {done}/{total} questions\n")
        stream.flush()
    return show


def _engine_kw(a, cfg) -> dict:
    return {"model": cfg.model, "policy": cfg.policy, "seed": cfg.seed, "faults": ",".join(sorted(cfg.faults)),
            "max_running": cfg.max_running, "page_size": cfg.page_size, "pool_slots": cfg.pool_slots,
            "max_context": cfg.max_context, "prefix_cache": cfg.prefix_cache,
            "max_prefill_tokens": cfg.max_prefill_tokens, "threads": cfg.threads, "device": cfg.device,
            "background": a.background, "spec": cfg.spec, "spec_k": cfg.spec_k, "spec_wrong": cfg.spec_wrong}


def format_result(r: dict) -> str:
    s = r["stats"]

    def pct(x):
        return f"{100 * x:.1f}%"
    lines = [
        f"GSM8K gate: target {r['target']} | data {r['data']} | {r['n']} questions | "
        f"{r['num_fewshot']}-shot | filter strict-match",
        f"  overlap off: {s['correct_ref']}/{r['n']} = {pct(s['acc_ref'])}  "
        f"(95% Wilson {pct(s['ci_ref'][0])} .. {pct(s['ci_ref'][1])})",
        f"  overlap on:  {s['correct_cand']}/{r['n']} = {pct(s['acc_cand'])}  "
        f"(95% Wilson {pct(s['ci_cand'][0])} .. {pct(s['ci_cand'][1])})",
        f"  discordant: {s['losses']} lost with overlap on, {s['gains']} gained | exact McNemar "
        f"p(one-sided) = {s['p_loss']:.3g}, p(two-sided) = {s['p_two_sided']:.3g}",
        f"  drop {100 * s['drop']:.2f} points, upper bound {100 * s['drop_upper']:.2f} | minimum effect "
        f"{100 * s['min_effect']:.1f} | {r['seconds']['total']:.0f} s",
        f"{r['verdict'].upper()}: {s['reason']}",
    ]
    if s.get("acc_truth") is not None:
        lines.insert(-1, f"  truth: {s['truth']}: {pct(s['acc_truth'])} | moved from it: {s['moved']} "
                         f"(two-sided p off {s['p_truth'][0]:.3g}, on {s['p_truth'][1]:.3g})")
    return "\n".join(lines)


def _write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for x in rows:
            f.write(json.dumps(x) + "\n")


def _read_runs(path: str) -> list[dict]:
    from harness.flags import UsageError
    from harness.jsonl import read_lines
    out = []
    for i, obj in records(read_lines(path, "--judge file", UsageError), path, UsageError):
        if not isinstance(obj, dict) or not {"qhash", "correct", "response"} <= obj.keys():
            raise UsageError(f"{path}:{i}: not a per-question record (qhash, correct, response)")
        if not isinstance(obj["qhash"], str) or not isinstance(obj["correct"], bool) \
                or not isinstance(obj["response"], (str, type(None))):
            raise UsageError(f"{path}:{i}: a per-question record has \"qhash\" (string), \"correct\" (true or "
                             f"false) and \"response\" (string)")
        out.append(obj)
    if not out:
        raise UsageError(f"{path} holds no records")
    return out


def cmd_judge(a) -> int:
    """Judge two saved runs (per-question records written by --save-runs)."""
    from harness.flags import UsageError
    from harness.evals.gsm8k import EvalError, pair_records
    from harness.oracles.stats import judge
    if not 0 < a.alpha < 1 or not 0 <= a.min_effect < 100:
        raise UsageError(f"--alpha must be in (0, 1) and --min-effect in [0, 100) points, got {a.alpha:g} and "
                         f"{a.min_effect:g}")
    on, off = _read_runs(a.judge[0]), _read_runs(a.judge[1])
    try:
        ref, cand, _ = pair_records(on, off)
    except EvalError as e:
        raise UsageError(str(e)) from None
    v = judge(ref, cand, a.alpha, a.min_effect / 100)
    if a.json:
        print(json.dumps({"verdict": v.verdict, "stats": v.to_dict()}))
    else:
        print(f"{v.verdict.upper()}: {v.reason} (off {100 * v.acc_ref:.1f}%, on {100 * v.acc_cand:.1f}%, "
              f"n {v.n})")
    return {"pass": EXIT_PASS, "inconclusive": EXIT_INCONCLUSIVE}.get(v.verdict, EXIT_LOSS)


def cmd_gsm8k(a) -> int:
    from harness.flags import UsageError, engine_config
    if a.judge:
        return cmd_judge(a)
    from harness.evals.gsm8k import lm_eval_available
    why = lm_eval_available()
    if why:
        raise UsageError(why)
    cfg = engine_config(a)  # validates every engine flag, the fault names and the policy
    if a.target != "ref" and cfg.faults:
        raise UsageError("--fault injects into the ref engine only; for --target openai start the servers with it")
    if not 0 <= a.background <= 64:  # requests per question: more would swamp the questions themselves
        raise UsageError(f"--background must be between 0 and 64, got {a.background}")
    if a.save_runs:
        from harness.search.reproducer import check_writable
        try:
            check_writable(a.save_runs)  # now, not after the run
        except OSError as e:
            raise UsageError(f"cannot write --save-runs {a.save_runs}: {e.strerror or e}") from None
    if a.target != "ref" and a.background:
        raise UsageError("--background applies to --target ref (for openai, send other traffic yourself)")
    if a.limit is not None and a.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {a.limit}")
    nshot = a.num_fewshot if a.num_fewshot is not None else (0 if cfg.model in ("arith", "tiny") else 5)
    if nshot < 0:
        raise UsageError(f"--num-fewshot must be at least 0, got {nshot}")
    if a.target == "ref":
        from harness.flags import build
        build(cfg)  # a missing model is a one-line error now, not mid-run
    from harness.evals.gsm8k import EvalError, RunFailure, resolve_data
    from harness.evals.run import GateOptions, run_gate, validate
    o = GateOptions(target=a.target, data=a.data, train=a.train, limit=a.limit, num_fewshot=nshot,
                    fewshot_seed=a.fewshot_seed, alpha=a.alpha, min_effect=a.min_effect / 100,
                    engine=_engine_kw(a, cfg), url_on=a.url,
                    url_off=a.url_off, model_name=a.served_model, concurrency=a.concurrency,
                    max_gen_toks=a.max_gen_toks, progress=None if a.quiet else _progress(),
                    truth_model=a.truth_model or None)
    try:  # every flag, the data and the endpoints, before the header: bad input is one line
        validate(o)
        resolve_data(o.data, o.train, o.num_fewshot)
    except EvalError as e:
        raise UsageError(str(e)) from None
    if not a.quiet:
        what = (f"model {cfg.model}, policy {cfg.policy}" + (f", faults {','.join(sorted(cfg.faults))}"
                                                             if cfg.faults else "")
                if a.target == "ref" else f"{a.url} (on) vs {a.url_off} (off)")
        print(f"overlap-harness gsm8k: target {a.target} ({what}), data {a.data or 'hub'}"
              + (f", limit {a.limit}" if a.limit else ""), file=sys.stderr)
    try:
        r = run_gate(o)
    except EvalError as e:
        raise UsageError(str(e)) from None
    except RunFailure as e:
        print(f"overlap-harness: error: the run failed, no accuracy verdict: {e}", file=sys.stderr)
        return EXIT_FAILED
    if a.save_runs:
        d = Path(a.save_runs)
        for arm in ("on", "off"):  # phash: the prompt asked, so --judge can refuse runs asked differently
            _write_jsonl(d / f"{arm}.jsonl", ({"qhash": p["qhash"], "phash": p["phash"], "question": p["question"],
                                              "gold": p["gold"], "response": p[arm], "correct": p[f"correct_{arm}"]}
                                             for p in r["pairs"]))
    if a.history:
        from harness.evals.history import append_history, plot_trend, read_history
        try:
            append_history(a.history, r)
            png = plot_trend(read_history(a.history), a.trend or Path(a.history).with_name("trend.png"))
            r["history"], r["trend_png"] = a.history, str(png)
        except OSError as e:
            print(f"overlap-harness: warning: cannot write the history {a.history}: {e.strerror or e}",
                  file=sys.stderr)
    if a.json:
        out = {k: v for k, v in r.items() if k != "pairs"}
        print(json.dumps(out))
    else:
        print(format_result(r))
        if r.get("trend_png"):
            print(f"history: {r['history']} | trend: {r['trend_png']}")
    return {"pass": EXIT_PASS, "inconclusive": EXIT_INCONCLUSIVE}.get(r["verdict"], EXIT_LOSS)


def add_commands(sub) -> None:
    from harness.flags import add_engine_flags
    p = sub.add_parser("gsm8k", help="GSM8K accuracy gate: overlap on vs off, exact McNemar test",
                       description=__doc__)
    add_engine_flags(p)
    p.set_defaults(model="arith")
    g = p.add_argument_group("gsm8k")
    g.add_argument("--target", default="ref", choices=("ref", "openai"),
                   help="ref: the engine in-process; openai: two OpenAI-compatible endpoints (--url, --url-off)")
    g.add_argument("--data", default=None, metavar="PATH",
                   help="GSM8K-schema JSONL (question, answer); default: openai/gsm8k from the hub")
    g.add_argument("--train", default=None, metavar="PATH",
                   help="few-shot examples (default: train.jsonl beside --data when --num-fewshot > 0)")
    g.add_argument("--limit", type=int, default=None, help="first N questions only")
    g.add_argument("--num-fewshot", type=int, default=None,
                   help="few-shot examples per prompt (default: 0 for the arith/tiny fixtures, else lm-eval's 5)")
    g.add_argument("--fewshot-seed", type=int, default=1234, metavar="N",
                   help="seed of the few-shot draw, the same for both arms and the truth run (default 1234, "
                        "lm-eval's)")
    g.add_argument("--background", type=int, default=0, metavar="N",
                   help="ref target: N short requests from other clients after each question (same on both "
                        "sides, not scored); they make rows turn over as in the article's Figure 9")
    g.add_argument("--max-gen-toks", type=int, default=256, help="new tokens per answer at most (default 256)")
    g.add_argument("--alpha", type=float, default=0.05, help="level of the one-sided McNemar test (default 0.05)")
    g.add_argument("--min-effect", type=float, default=3.0,
                   help="smallest accuracy drop that counts as a loss, in points (default 3)")
    g.add_argument("--url", help="openai target: the endpoint with overlap on (http://host:port)")
    g.add_argument("--url-off", help="openai target: the endpoint with overlap off")
    g.add_argument("--served-model", help="openai target: model name (default: the first of GET /v1/models)")
    g.add_argument("--concurrency", type=int, default=8, help="openai target: concurrent requests (default 8)")
    g.add_argument("--truth-model", default=None, metavar="MODEL",
                   help="when the arms differ, run the ref engine on this model (the same weights the arms serve, "
                        "one request at a time, overlap off) as the absolute reference that says which arm moved")
    g.add_argument("--history", default=DEFAULT_HISTORY, metavar="FILE",
                   help=f"append the result to this JSONL and redraw the trend (default {DEFAULT_HISTORY}; "
                        "'' for none)")
    g.add_argument("--trend", default=None, metavar="PNG", help="trend plot (default: trend.png beside --history)")
    g.add_argument("--save-runs", metavar="DIR", help="write each side's per-question records (on/off.jsonl)")
    g.add_argument("--judge", nargs=2, metavar=("ON.jsonl", "OFF.jsonl"),
                   help="judge two saved runs instead of running (their question sets must match)")
    g.add_argument("--quiet", action="store_true", help="no progress on stderr")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(fn=cmd_gsm8k)
