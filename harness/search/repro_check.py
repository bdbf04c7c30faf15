"""Checks a reproducer's contents before `replay` runs it, so that a damaged or hand-edited
file is refused as a bad reproducer (exit 2) instead of crashing the engine, which `replay`
would report as the engine failing (exit 1), or running it without end.

Each field gets the checks its CLI flag gets (harness.validate); then the engine is built once
and every request must fit it, and the workload must be small enough that the step limit
which guards every run (stress.step_limit) is reached in reasonable time.
"""
from __future__ import annotations

import dataclasses

from harness.validate import ABORT_AFTER, ARRIVAL, INT64, ParamError, Range, check_engine, check_sampling, check_value

MAX_STEPS = 200_000  # a shrunk reproducer needs a few hundred; this bounds a replay to minutes


class BadReproducer(ValueError):
    """What is wrong with the file, one line."""


class Unavailable(ValueError):
    """The reproducer is fine but this machine cannot run it (a model missing)."""


def _request(r, i: int, vocab: int, fields: tuple[str, ...]):
    from harness.engine.request import Request
    where = f"request {i}"
    if not isinstance(r, dict):
        raise BadReproducer(f"{where} is not an object")
    unknown = sorted(set(r) - set(fields))
    if unknown:
        raise BadReproducer(f"{where}: unknown field(s) {', '.join(unknown)}")
    for k in ("rid", "prompt_ids", "max_new_tokens"):
        if k not in r:
            raise BadReproducer(f"{where}: missing \"{k}\"")
    if not isinstance(r["rid"], str) or not r["rid"]:
        raise BadReproducer(f"{where}: \"rid\" must be a non-empty string")
    ids = r["prompt_ids"]
    if not isinstance(ids, list) or not ids or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
        raise BadReproducer(f"{where}: \"prompt_ids\" must be a non-empty list of token ids in [0, {vocab})")
    stop = r.get("stop", [])
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadReproducer(f"{where}: \"stop\" must be a list of non-empty strings")
    label = (lambda n: f"{where}: \"{n}\"")
    try:
        check_sampling({"max_tokens": r["max_new_tokens"], **{k: r.get(k) for k in
                                                            ("temperature", "top_p", "repetition_penalty", "seed")}},
                       lambda n: label("max_new_tokens" if n == "max_tokens" else n))
        check_value("arrival", r.get("arrival", 0), ARRIVAL, label)
        if r.get("abort_after") is not None:
            check_value("abort_after", r["abort_after"], ABORT_AFTER, label)
    except ParamError as e:
        raise BadReproducer(str(e)) from None
    if not isinstance(r.get("ignore_eos", False), bool):
        raise BadReproducer(f"{where}: \"ignore_eos\" must be true or false")
    return Request(**dict(r, stop=tuple(stop), prompt_ids=list(ids)))


def check_reproducer(d: dict, detect_modes: tuple[str, ...], request_fields: tuple[str, ...]):
    """(engine switches, policy, requests, faults, seed) of a parsed reproducer; BadReproducer
    or Unavailable otherwise."""
    from harness.engine.build import ModelUnavailable, build_engine, load_model
    from harness.engine.config import Costs, EngineConfig
    for k in ("engine", "policy", "requests"):
        if k not in d:
            raise BadReproducer(f"missing \"{k}\"")
    engine = d["engine"]
    if not isinstance(engine, dict):
        raise BadReproducer("\"engine\" is not an object")
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    extra = sorted(set(engine) - names)
    if extra:
        raise BadReproducer(f"engine switch(es) {', '.join(extra)} unknown to this version")
    engine = {k: v for k, v in engine.items() if k not in ("overlap", "faults", "policy", "seed")}
    faults = d.get("faults", [])
    if not isinstance(faults, list) or not all(isinstance(f, str) for f in faults):
        raise BadReproducer("\"faults\" must be a list of fault names")
    if d.get("detect", "all") not in detect_modes:
        raise BadReproducer(f"unknown detect mode {d.get('detect')!r}")
    if not isinstance(d.get("failure", {}), dict):
        raise BadReproducer("\"failure\" is not an object")
    seed = d.get("seed", 0)
    costs = engine.get("costs", {})
    try:
        check_value("seed", seed, Range(*INT64, integer=True), lambda n: f"\"{n}\"")
        if not isinstance(costs, dict):
            raise BadReproducer("engine \"costs\" is not an object")
        cfg = EngineConfig(**{**{k: v for k, v in engine.items() if k != "costs"}, "costs": Costs(**costs),
                              "policy": d["policy"], "seed": seed, "faults": frozenset(faults)})
        check_engine(cfg, lambda n: f"engine \"{n}\"" if n not in ("policy", "seed") else f"\"{n}\"")
    except ParamError as e:
        raise BadReproducer(str(e)) from None
    except TypeError as e:  # Costs(**costs) with a field this version does not know
        raise BadReproducer(f"engine \"costs\": {e}") from None
    try:
        mcfg = load_model(cfg.model, cfg.max_context)[0]
    except ModelUnavailable as e:
        raise Unavailable(str(e)) from None
    if cfg.page_size > mcfg.max_context:
        raise BadReproducer(f"engine \"page_size\" {cfg.page_size} exceeds the context of {mcfg.max_context}")
    reqs = d["requests"]
    if not isinstance(reqs, list) or not reqs:
        raise BadReproducer("\"requests\" must be a non-empty list")
    reqs = [_request(r, i, mcfg.vocab_size, request_fields) for i, r in enumerate(reqs)]
    if len({r.rid for r in reqs}) != len(reqs):
        raise BadReproducer("two requests share a \"rid\"")
    try:  # what the engine itself refuses at construction (a drafter it cannot load, ...)
        eng, _ = build_engine(cfg)
    except (ModelUnavailable, RuntimeError) as e:
        raise Unavailable(str(e).strip().splitlines()[0]) from None
    except ValueError as e:
        raise BadReproducer(f"the engine cannot be built: {e}") from None
    for r in reqs:
        why = eng.check_fits(r)  # a request that can never run would leave the engine waiting forever
        if why:
            raise BadReproducer(why)
    from harness.search.case import step_limit
    if step_limit(reqs) > MAX_STEPS:
        raise BadReproducer(f"the workload may need {step_limit(reqs)} steps (more than {MAX_STEPS}); "
                            f"a reproducer is a shrunk case")
    return engine, d["policy"], reqs, frozenset(faults), seed
