"""Reproducers: a failing case as JSON (serialize), read back and checked (load), run again (replay);
the artifacts written beside it (a Chrome trace and a PNG timeline around the failing step)."""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile

from harness.engine.request import Request
from harness.search.case import DETECT, Failure, check, execute
from harness.workloads.strategies import Case

FORMAT = "overlap-harness-repro"
VERSION = 1


def harness_version() -> str:
    try:
        from importlib.metadata import version
        return version("overlap-harness")
    except Exception:  # not installed (a checkout on sys.path)
        return "unknown"


REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(Request)[:[f.name for f in dataclasses.fields(Request)]
                                                                   .index("output_ids")])


def request_to_dict(r: Request) -> dict:
    d = {k: getattr(r, k) for k in REQUEST_FIELDS}
    d["stop"] = list(d["stop"])
    return d


def request_from_dict(d: dict) -> Request:
    unknown = set(d) - set(REQUEST_FIELDS)
    if unknown:
        raise ValueError(f"unknown request field(s) {', '.join(sorted(unknown))}")
    d = dict(d)
    d["stop"] = tuple(d.get("stop", ()))
    d["prompt_ids"] = [int(t) for t in d["prompt_ids"]]
    return Request(**d)


def engine_dict(case: Case, model: str) -> dict:
    """Every EngineConfig switch of the run under test (faults, policy and seed stand apart)."""
    from harness.engine.config import EngineConfig
    kw = dict(case.engine)
    kw.setdefault("model", model)
    cfg = EngineConfig(**{k: v for k, v in kw.items() if k != "costs"})
    d = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
         if f.name not in ("faults", "policy", "seed", "costs")}
    d["costs"] = dataclasses.asdict(cfg.costs) if not isinstance(kw.get("costs"), dict) else kw["costs"]
    return d


def reproducer(case: Case, failure: Failure, *, faults, seed, model, detect) -> dict:
    return {"format": FORMAT, "version": VERSION, "harness_version": harness_version(), "seed": seed,
            "faults": sorted(faults), "detect": detect, "engine": engine_dict(case, model), "policy": case.policy,
            "requests": [request_to_dict(r) for r in case.requests], "failure": failure.to_dict()}


class ReproError(ValueError):
    """A file that is not one of our reproducers, or one from an incompatible version."""


class ReproUnavailable(ReproError):
    """A sound reproducer this machine cannot run (its model is missing)."""


def load_reproducer(path: str) -> dict:
    """The reproducer as a dict plus 'case' (a Case) and 'faults' (a frozenset); ReproError if bad."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise ReproError(f"cannot read {path}: {e.strerror}") from None
    try:
        d = json.loads(text.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ReproError(f"{path} is not an overlap-harness reproducer (not JSON)") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ReproError(f"{path} is not an overlap-harness reproducer (no \"format\": \"{FORMAT}\")")
    if d.get("version") != VERSION:
        raise ReproError(f"{path} is reproducer format version {d.get('version')!r} (written by overlap-harness "
                         f"{d.get('harness_version', '?')}); this overlap-harness {harness_version()} reads "
                         f"version {VERSION}")
    from harness.search.repro_check import BadReproducer, Unavailable, check_reproducer
    try:  # every field as its CLI flag is checked; the engine built once; every request fits it
        engine, policy, reqs, faults, _ = check_reproducer(d, DETECT, REQUEST_FIELDS)
    except BadReproducer as e:
        raise ReproError(f"{path}: incompatible or damaged reproducer ({e})") from None
    except Unavailable as e:
        raise ReproUnavailable(f"cannot replay {path} here: {e}") from None
    return dict(d, case=Case(engine, policy, reqs), faults=faults)


def check_writable(out: str) -> None:
    """Raise OSError with a reason when `out` cannot be created or written."""
    os.makedirs(out, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".probe-", dir=out)
    os.close(fd)
    os.remove(probe)


def write_artifacts(out: str, case: Case, failure: Failure, *, faults, seed, model, detect) -> dict:
    """The reproducer JSON, and a Chrome trace and a PNG of the streams around the failing step."""
    os.makedirs(out, exist_ok=True)
    repro = os.path.join(out, "repro.json")
    with open(repro, "w", encoding="utf-8") as f:
        json.dump(reproducer(case, failure, faults=faults, seed=seed, model=model, detect=detect), f, indent=1)
    paths = {"repro": repro}
    try:
        paths.update(timeline(out, case, failure, faults=faults, seed=seed, model=model))
    except Exception as e:  # the reproducer matters most; say why there is no picture
        paths["timeline_error"] = f"{type(e).__name__}: {e}"
    return paths


def timeline(out: str, case: Case, failure: Failure, *, faults, seed, model) -> dict:
    from harness.device.trace import write_timeline
    ex = None
    try:
        ex = execute(case, faults=faults, seed=seed, model=model, track=failure.kind == "hazard")
    except Exception:
        pass
    if ex is None or ex.engine is None:
        raise RuntimeError("the case does not run to the end (it crashed), so there is no timeline")
    dev = ex.engine.dev
    last = max((op.step for op in dev.ops), default=0)
    step = failure.step if failure.step is not None else last
    marks = failure.ops
    if ex.hazards:
        h = ex.hazards[0]
        step, marks = h.step, tuple(x for x in (h.first.op_id, h.second.op_id) if x is not None)
    lo = step - 2
    by_id = {op.id: op for op in dev.ops}
    for m in marks:
        if m in by_id:
            lo = min(lo, by_id[m].step)
    steps = (max(0, lo), min(last, step + 2))
    short = failure.summary if len(failure.summary) <= 80 else failure.summary[:77] + "..."
    title = f"{failure.kind} at step {step}: {short}"
    return write_timeline(dev, out, steps, title, highlight=step, marks=marks)


def replay(d: dict) -> Failure | None:
    f, _ = check(d["case"], faults=d["faults"], seed=d.get("seed", 0), model=d["case"].engine.get("model", "tiny"),
                 detect=d.get("detect", "all"))
    return f
