"""The GSM8K gate: the same questions with overlap off (reference) and on (candidate),
judged with the exact McNemar test on the discordant pairs (harness.oracles.stats.judge)."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from harness.evals.gsm8k import (FEWSHOT_SEED, EvalError, RunFailure, check_errors, make_task, pair_records,
                                 resolve_data, run_side)


@dataclass
class GateOptions:
    target: str = "ref"  # ref | openai
    data: str | None = None  # None / "hub": openai/gsm8k; else a GSM8K-schema JSONL
    train: str | None = None
    limit: int | None = None
    num_fewshot: int = 0
    fewshot_seed: int = FEWSHOT_SEED  # both arms and the truth run draw the same few-shot examples
    alpha: float = 0.05
    min_effect: float = 0.03
    # ref target
    engine: dict = field(default_factory=dict)  # OverlapRefLM keyword arguments (model, policy, faults, ...)
    # openai target
    url_on: str | None = None
    url_off: str | None = None
    model_name: str | None = None
    concurrency: int = 8
    max_gen_toks: int = 256
    progress: object = None  # progress(label, done, total)
    served: dict = field(default_factory=dict)  # url -> model name, probed once by validate()
    # the truth where the arms differ: the ref engine on this model (the same weights the arms
    # serve), one request at a time, overlap off, run only when the verdict is a finding, so a
    # correct pair costs nothing more; None: no absolute reference
    truth_model: str | None = None


def _get_json(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def probe_endpoint(url: str) -> str:
    """The first model an OpenAI-compatible endpoint lists; EvalError if it cannot be reached."""
    base = url.rstrip("/").removesuffix("/v1/completions").removesuffix("/v1")
    try:
        models = _get_json(f"{base}/v1/models")
    except urllib.error.HTTPError as e:
        raise EvalError(f"endpoint {base} answered GET /v1/models with HTTP {e.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        why = getattr(e, "reason", None) or e
        raise EvalError(f"cannot reach endpoint {base}: {why}") from None
    try:
        return models["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        raise EvalError(f"endpoint {base}: GET /v1/models did not list a model") from None


def _completions_url(url: str) -> str:
    base = url.rstrip("/").removesuffix("/v1/completions").removesuffix("/v1")
    return f"{base}/v1/completions"


def same_endpoint(a: str, b: str) -> bool:
    norm = (lambda u: u.strip().rstrip("/").removesuffix("/v1/completions").removesuffix("/v1").rstrip("/").lower())
    return norm(a) == norm(b)


def make_lm(o: GateOptions, overlap: bool, label: str):
    if o.target == "ref":
        from harness.evals.lm import OverlapRefLM
        prog = None if o.progress is None else (lambda d, t: o.progress(label, d, t))
        return OverlapRefLM(overlap=overlap, progress=prog, max_gen_toks=o.max_gen_toks, **o.engine)
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    url = o.url_on if overlap else o.url_off
    try:  # validate() probed it before the run; an endpoint gone since is a failed run, not bad input
        name = o.model_name or o.served.get(url) or probe_endpoint(url)
    except EvalError as e:
        raise RunFailure(f"the {label} endpoint went away mid-run: {e}") from None
    return LocalCompletionsAPI(base_url=_completions_url(url), model=name, tokenizer_backend=None,
                               num_concurrent=o.concurrency, max_retries=2, max_gen_toks=o.max_gen_toks,
                               timeout=600)


def validate(o: GateOptions) -> None:
    if o.target not in ("ref", "openai"):
        raise EvalError(f"unknown target {o.target!r}: expected ref or openai")
    if o.limit is not None and o.limit < 1:
        raise EvalError(f"--limit must be at least 1, got {o.limit}")
    if not 0 < o.alpha < 1:
        raise EvalError(f"--alpha must be between 0 and 1, got {o.alpha}")
    if not 0 <= o.min_effect < 1:
        raise EvalError(f"--min-effect must be a fraction in [0, 1), got {o.min_effect}")
    if not isinstance(o.max_gen_toks, int) or o.max_gen_toks < 1:
        raise EvalError(f"--max-gen-toks must be at least 1, got {o.max_gen_toks}")
    if not isinstance(o.concurrency, int) or not 1 <= o.concurrency <= 1024:
        raise EvalError(f"--concurrency must be between 1 and 1024, got {o.concurrency}")
    if o.truth_model:  # now, not after both arms ran
        from harness.engine.build import ModelUnavailable, load_model
        try:
            load_model(o.truth_model)
        except (ModelUnavailable, ValueError) as e:
            raise EvalError(f"--truth-model {o.truth_model}: {e}") from None
    if o.target == "openai":
        if not o.url_on or not o.url_off:
            raise EvalError("--target openai needs --url (overlap on) and --url-off (overlap off)")
        if same_endpoint(o.url_on, o.url_off):  # one server judged against itself proves nothing
            raise EvalError(f"--url and --url-off are the same endpoint ({o.url_on}): start one server with "
                            f"overlap and one without")
        for u in (o.url_on, o.url_off):
            if u not in o.served:
                o.served[u] = probe_endpoint(u)


def run_gate(o: GateOptions) -> dict:
    """Run both sides and judge. Raises EvalError (bad input) or RunFailure (target failed)."""
    from harness.oracles.stats import FINDINGS, judge
    validate(o)
    ds = resolve_data(o.data, o.train, o.num_fewshot)
    task = make_task(ds, o.num_fewshot)
    t0 = time.perf_counter()
    sides = {}
    for label, overlap in (("overlap off", False), ("overlap on", True)):
        try:
            lm = make_lm(o, overlap, label)
        except EvalError as e:  # validate() passed: anything now is the run failing
            raise RunFailure(str(e)) from None
        side = run_side(lm, task, o.limit, label, o.fewshot_seed)
        check_errors(side)
        sides[label] = side
    off, on = sides["overlap off"], sides["overlap on"]
    ref, cand, pairs = pair_records(on.records, off.records)
    v = judge(ref, cand, o.alpha, o.min_effect)
    truth = None
    if o.truth_model and v.verdict in FINDINGS:
        truth = run_truth(o, task, pairs)
        v = judge(ref, cand, o.alpha, o.min_effect, truth=[truth["correct"][p["qhash"]] for p in pairs],
                  truth_label=truth["label"])
    n = len(pairs)
    return {
        "verdict": v.verdict, "stats": v.to_dict(), "n": n, "target": o.target, "data": ds.describe(),
        "limit": o.limit, "num_fewshot": o.num_fewshot, "fewshot_seed": o.fewshot_seed,
        "engine": {k: (sorted(x) if isinstance(x, (set, frozenset)) else x) for k, x in o.engine.items()}
        if o.target == "ref" else {"url_on": o.url_on, "url_off": o.url_off},
        "accuracy": {"off": off.accuracy, "on": on.accuracy},
        "seconds": {"off": off.seconds, "on": on.seconds, "total": time.perf_counter() - t0},
        "questions_per_minute": {"off": 60 * n / off.seconds if off.seconds else None,
                                 "on": 60 * n / on.seconds if on.seconds else None},
        "summary": {"off": off.summary, "on": on.summary},
        "pairs": pairs,
        "truth": None if truth is None else {k: x for k, x in truth.items() if k != "correct"},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def run_truth(o: GateOptions, task, pairs) -> dict:
    """The ref engine on the same questions, one request at a time with overlap off (exact, and
    batch-invariant): which questions it answers right, per question hash."""
    from harness.evals.lm import OverlapRefLM
    lm = OverlapRefLM(model=o.truth_model, overlap=False, max_running=1, max_gen_toks=o.max_gen_toks)
    side = run_side(lm, task, o.limit, "truth", o.fewshot_seed)
    got = {r["qhash"]: r["correct"] for r in side.records}
    missing = [p["qhash"] for p in pairs if p["qhash"] not in got]
    if missing:
        raise RunFailure(f"the truth run (ref engine, {o.truth_model}) lacks {len(missing)} of the questions")
    return {"label": f"the ref engine ({o.truth_model}, one request at a time, overlap off)", "correct": got,
            "accuracy": side.accuracy, "seconds": side.seconds}


__all__ = ["GateOptions", "run_gate", "EvalError", "RunFailure", "probe_endpoint"]
