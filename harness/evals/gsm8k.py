"""GSM8K through lm-eval's own gsm8k task (its prompt, `until` stop sequences and answer
filters), overlap on and off on the same questions, with per-question records.

Data: lm-eval's dataset (openai/gsm8k from the hub) or a local JSONL in GSM8K's schema; a
local file is handed to lm-eval as a `json` dataset, the rest of the task config is lm-eval's.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.evals.data import HUB, DataError, default_train_path, gold_answer, question_hash, read_jsonl

FEWSHOT_SEED = 1234  # lm-eval's own default (--fewshot_random_seed); every arm draws its examples from it
PRIMARY = "strict-match"  # lm-eval's gsm8k headline filter ("#### N"); flexible-extract is kept too
FILTERS = ("strict-match", "flexible-extract")


class EvalError(Exception):
    """Bad input for an evaluation (one line, exit 2)."""


class RunFailure(Exception):
    """The target failed mid-run (engine crash, server gone): reported as such, never as a loss."""


def lm_eval_available() -> str | None:
    """None, or why lm-eval cannot be used."""
    try:
        import lm_eval  # noqa: F401
    except ImportError as e:
        return f"lm-eval is not installed ({e.name}); install the `evals` extra: pip install -e '.[evals]'"
    return None


def _quiet_lm_eval() -> None:
    for name in ("lm-eval", "lm_eval", "lm_eval.api", "lm_eval.evaluator", "lm_eval.api.task",
                 "lm_eval.models", "datasets", "httpx"):
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # "Task exception was never retrieved" noise


def gsm8k_config(num_fewshot: int = 0) -> dict:
    """lm-eval's gsm8k task config, as its YAML says."""
    import lm_eval
    from lm_eval.tasks._yaml_loader import load_yaml
    path = Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml"
    cfg = dict(load_yaml(str(path), resolve_func=True))
    for key in ("tag", "group"):
        cfg.pop(key, None)
    cfg["num_fewshot"] = num_fewshot
    return cfg


@dataclass
class Dataset:
    """Where the questions come from, resolved and validated."""
    source: str  # "hub" or a path
    test: Path | None = None
    train: Path | None = None
    docs: list[dict] = field(default_factory=list)  # local only: the validated test docs

    def describe(self) -> str:
        return "openai/gsm8k (hub)" if self.source == HUB else str(self.test)


def resolve_data(data: str | None, train: str | None, num_fewshot: int) -> Dataset:
    if data in (None, "", HUB):
        if train:
            raise EvalError("--train needs a local --data file (the hub dataset has its own train split)")
        return Dataset(HUB)
    try:
        docs = read_jsonl(data)
        tr = Path(train) if train else (default_train_path(data) if num_fewshot > 0 else None)
        if tr is not None:
            read_jsonl(tr)
    except DataError as e:
        raise EvalError(str(e)) from None
    if num_fewshot > 0 and tr is None:
        raise EvalError(f"--num-fewshot {num_fewshot} needs few-shot examples: give --train FILE.jsonl")
    return Dataset(str(data), Path(data), tr, docs)


def make_task(ds: Dataset, num_fewshot: int):
    """lm-eval's gsm8k ConfigurableTask, pointed at the data."""
    from lm_eval.api.task import ConfigurableTask
    cfg = gsm8k_config(num_fewshot)
    if ds.source != HUB:
        files = {"test": str(ds.test)}
        if ds.train is not None:
            files["train"] = str(ds.train)
        else:
            cfg["training_split"] = None
            cfg["fewshot_split"] = None
        cfg.update(dataset_path="json", dataset_name=None, dataset_kwargs={"data_files": files})
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return ConfigurableTask(config=cfg)
    except Exception as e:  # noqa: BLE001 - datasets raises many kinds (offline, bad file)
        where = "openai/gsm8k from the hub" if ds.source == HUB else str(ds.test)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise EvalError(f"cannot load {where}: {msg[:300]}") from None


# -- one side: run lm-eval, keep per-question records ---------------------------------------
@dataclass
class SideResult:
    label: str
    records: list[dict]
    accuracy: dict  # filter -> lm-eval's exact_match
    seconds: float
    summary: dict = field(default_factory=dict)


class _Refusals(logging.Handler):
    """lm-eval's API models log a refused request's status and body as a warning, then raise a
    bare HTTP error: keep the server's own words so the failure can say why."""

    PATTERN = re.compile(r"Status code: (\d+), Response text: (.*)\. Retrying", re.S)

    def __init__(self):
        super().__init__(logging.WARNING)
        self.last: str | None = None

    def emit(self, record):
        m = self.PATTERN.search(record.getMessage())
        if m:
            self.last = f"HTTP {m.group(1)}: {_server_message(m.group(2))}"


def _server_message(body: str) -> str:
    """The message of an OpenAI-schema error body ({"error": {"message": ...}}), else the body."""
    try:
        err = json.loads(body)["error"]
        msg = err["message"] if isinstance(err, dict) else str(err)
    except (ValueError, KeyError, TypeError):
        msg = body
    return " ".join(str(msg).split())[:300]


@contextlib.contextmanager
def _refusals():
    log = logging.getLogger("lm_eval.models.api_models")
    h = _Refusals()
    saved = log.level, log.propagate
    log.setLevel(logging.WARNING)
    log.propagate = False  # quiet, as _quiet_lm_eval wants; the handler still sees the warnings
    log.addHandler(h)
    try:
        yield h
    finally:
        log.removeHandler(h)
        log.setLevel(saved[0])
        log.propagate = saved[1]


def run_side(lm, task, limit: int | None, label: str, fewshot_seed: int = FEWSHOT_SEED) -> SideResult:
    from lm_eval.evaluator import evaluate
    _quiet_lm_eval()
    # the task's sampler is built unseeded and is stateful: without a seed set before each arm, the
    # arms (and the truth run) would draw different few-shot examples and a "paired" test would
    # compare different prompts
    task.set_fewshot_seed(fewshot_seed)
    t = time.perf_counter()
    task_dict = {"tasks": {"gsm8k": task}, "groups": {}}
    try:
        with contextlib.redirect_stderr(io.StringIO()) if not sys.stderr.isatty() else contextlib.nullcontext(), \
                _refusals() as refused:
            res = evaluate(lm, task_dict, limit=limit, log_samples=True, bootstrap_iters=0)
    except (EvalError, RunFailure):
        raise
    except Exception as e:  # noqa: BLE001
        if refused.last:
            raise RunFailure(f"the {label} endpoint refused a request: {refused.last}") from e
        raise RunFailure(f"the {label} run stopped: {_failure_line(e)}") from e
    secs = time.perf_counter() - t
    samples = res["samples"]["gsm8k"]
    acc = {f: _float(res["results"]["gsm8k"].get(f"exact_match,{f}")) for f in FILTERS}
    return SideResult(label, records_from_samples(samples), acc, secs, getattr(lm, "last_summary", {}) or {})


def _float(v):
    return None if v is None else float(v)


def _failure_line(e: BaseException) -> str:
    seen = set()
    while e is not None and id(e) not in seen:  # the innermost useful cause
        seen.add(id(e))
        nxt = e.__cause__ or e.__context__
        if nxt is None or type(e).__name__ in ("EngineFailure",):
            break
        e = nxt
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg[:300]}"


NONE_ANSWER = "LMEVAL_MODEL_NONE_ANSWER_PLACEHOLDER"


def records_from_samples(samples: list[dict]) -> list[dict]:
    """One record per question from lm-eval's logged samples (one sample per filter)."""
    by_doc: dict[int, dict] = {}
    for s in samples:
        d = s["doc"]
        rec = by_doc.setdefault(s["doc_id"], {
            "doc_id": s["doc_id"], "qhash": question_hash(d["question"]), "question": d["question"],
            "gold": gold_answer(d["answer"]), "response": (s.get("resps") or [[""]])[0][0],
            "phash": prompt_hash(s)})
        f = s.get("filter")
        fr = s.get("filtered_resps")
        rec[f"extracted[{f}]"] = fr[0] if isinstance(fr, list) and fr else fr
        rec[f"correct[{f}]"] = bool(s.get("exact_match", 0.0))
    out = [by_doc[k] for k in sorted(by_doc)]
    for r in out:
        r["correct"] = r.get(f"correct[{PRIMARY}]", False)
        r["error"] = r["response"] == NONE_ANSWER or r["response"] is None
    return out


def prompt_hash(sample: dict) -> str | None:
    """A hash of the prompt lm-eval sent for a logged sample (its context, few-shot examples
    included); None where the sample does not carry it."""
    try:
        ctx = sample["arguments"][0][0]
    except (KeyError, IndexError, TypeError):
        return None
    return hashlib.sha256(str(ctx).encode()).hexdigest()[:16]


def pair_records(on: list[dict], off: list[dict]) -> tuple[list[bool], list[bool], list[dict]]:
    """Align two runs by question; different question sets, or the same question asked with
    different prompts (where both runs recorded theirs), are an error."""
    a = {r["qhash"]: r for r in on}
    b = {r["qhash"]: r for r in off}
    if len(a) != len(on) or len(b) != len(off):
        raise EvalError("a run holds the same question twice: records must be one per question")
    if a.keys() != b.keys():
        only_a, only_b = len(a.keys() - b.keys()), len(b.keys() - a.keys())
        raise EvalError(f"the two runs' question sets differ ({only_a} questions only in the first, "
                        f"{only_b} only in the second): a paired test needs the same questions")
    keys = [r["qhash"] for r in off]
    moved = [k for k in keys if a[k].get("phash") and b[k].get("phash") and a[k]["phash"] != b[k]["phash"]]
    if moved:
        raise EvalError(f"the two runs asked {len(moved)} of {len(keys)} questions with different prompts "
                        f"(other few-shot examples?): a paired test needs the same prompt on both sides")
    pairs = [{"qhash": k, "question": b[k]["question"], "gold": b[k]["gold"],
              "phash": b[k].get("phash"), "off": b[k]["response"], "on": a[k]["response"],
              "correct_off": b[k]["correct"], "correct_on": a[k]["correct"]} for k in keys]
    return [b[k]["correct"] for k in keys], [a[k]["correct"] for k in keys], pairs


def check_errors(side: SideResult) -> None:
    bad = [r for r in side.records if r.get("error")]
    if bad:
        raise RunFailure(f"{len(bad)} of {len(side.records)} answers from the {side.label} run never came back "
                         f"(the endpoint failed or returned nothing); not judged as an accuracy loss")
