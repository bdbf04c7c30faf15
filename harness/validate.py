"""Range checks for what a request may ask for, shared by every edge that takes sampling
parameters: the CLI's flags, its prompt files, the server's request bodies and reproducers.
One table, so a value the server refuses is refused by the CLI in the same words and a value
the CLI accepts never reaches the engine to crash it there.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Callable

INT64 = (-(1 << 63), (1 << 63) - 1)  # seeds travel to the device as int64 (loop.py's batch[s].seeds)


class ParamError(ValueError):
    """A value out of range or of the wrong type; `param` names the field (the server's
    OpenAI error schema reports it)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Range:
    lo: float
    hi: float | None = None  # None: no upper bound
    lo_open: bool = False  # lo itself is refused (top_p 0 would keep no token)
    integer: bool = False

    def describe(self) -> str:
        if self.hi == INT64[1] and self.lo == INT64[0]:
            return "a 64-bit integer"
        lo, hi = (f"{x:g}" if isinstance(x, float) else str(x) for x in (self.lo, self.hi))
        if self.hi is None:
            return f"more than {lo}" if self.lo_open else f"at least {lo}"
        return f"> {lo} and <= {hi}" if self.lo_open else f"between {lo} and {hi}"

    def holds(self, v) -> bool:
        if isinstance(v, float) and not math.isfinite(v):
            return False
        return (self.lo < v if self.lo_open else self.lo <= v) and (self.hi is None or v <= self.hi)


ARRIVAL = Range(0, 1 << 31, integer=True)  # a loop iteration; the loop skips idle ones, so any is cheap
ABORT_AFTER = Range(0, 1 << 20, integer=True)  # tokens a client sees before it aborts

# what a request may ask for (OpenAI's ranges where OpenAI gives one)
SAMPLING = {
    "max_tokens": Range(1, 1 << 20, integer=True),
    "temperature": Range(0.0, 2.0),
    "top_p": Range(0.0, 1.0, lo_open=True),
    "repetition_penalty": Range(0.0, 100.0, lo_open=True),  # a divisor of the logits: 0 is undefined
    "seed": Range(*INT64, integer=True),
}


def quoted(name: str) -> str:
    return f"'{name}'"


def flag(name: str) -> str:
    """How the CLI names a field: --top-p for top_p."""
    return "--" + name.replace("_", "-")


def check_value(name: str, value, rng: Range, label: Callable[[str], str] = quoted):
    """`value` if it is a number of the right kind inside `rng`; ParamError otherwise."""
    integer = rng.integer
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        got = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None), list, dict)) else repr(value)
        raise ParamError(f"{label(name)} must be {'an integer' if integer else 'a number'}, got {got}", name)
    if not rng.holds(value):
        raise ParamError(f"{label(name)} must be {rng.describe()}, got {value}", name)
    return value


def check_sampling(values: dict, label: Callable[[str], str] = quoted) -> dict:
    """Check every sampling field present (and not None) in `values`; returns `values`."""
    for name, rng in SAMPLING.items():
        v = values.get(name)
        if v is not None:
            check_value(name, v, rng, label)
    return values


# -- engine switches: the CLI's flags and a reproducer's "engine" object ----------------------
def _engine_ranges() -> dict:
    from harness.engine.config import MAX_SPEC_K
    return {"max_running": Range(1, 4096, integer=True), "pool_slots": Range(2, 1 << 22, integer=True),
            "page_size": Range(1, 1 << 16, integer=True), "max_prefill_tokens": Range(1, 1 << 20, integer=True),
            "max_context": Range(8, 1 << 20, integer=True), "threads": Range(1, 1024, integer=True),
            "spec_k": Range(1, MAX_SPEC_K, integer=True), "spec_wrong": Range(0.0, 1.0),
            "seed": Range(*INT64, integer=True)}


CHOICES = {"device": ("sim", "cuda"), "spec": (None, "oracle", "mtp", "ngram")}


def check_engine(cfg, label: Callable[[str], str] = flag) -> None:
    """Every switch of an EngineConfig, by type and range, before an engine is built from it
    (ParamError names the first bad one). The model name and the context-dependent page size
    are checked where the model is loaded (cli.build)."""
    from harness.device.policies import ENGINE_STREAMS, PolicyError, parse_policy
    from harness.engine.config import MODELS
    from harness.faults import CATALOGUE
    for name, rng in _engine_ranges().items():
        v = getattr(cfg, name)
        if v is not None or name not in ("max_context", "threads"):
            check_value(name, v, rng, label)
    for name in ("overlap", "prefix_cache"):
        if not isinstance(getattr(cfg, name), bool):
            raise ParamError(f"{label(name)} must be true or false, got {getattr(cfg, name)!r}", name)
    for name, choices in (("model", MODELS), *CHOICES.items()):
        if getattr(cfg, name) not in choices:
            raise ParamError(f"{label(name)} must be one of {', '.join(map(str, choices))}, "
                             f"got {getattr(cfg, name)!r}", name)
    if cfg.max_context is not None and cfg.page_size > cfg.max_context:
        raise ParamError(f"{label('page_size')} {cfg.page_size} exceeds {label('max_context')} {cfg.max_context}: "
                         f"a row holds whole pages", "page_size")
    if cfg.pool_slots < 2 * cfg.page_size:  # page 0 pads; a request needs at least one more
        raise ParamError(f"{label('pool_slots')} {cfg.pool_slots} holds fewer than two pages of "
                         f"{label('page_size')} {cfg.page_size}", "pool_slots")
    if not isinstance(cfg.policy, str):
        raise ParamError(f"{label('policy')} must be a string, got {cfg.policy!r}", "policy")
    try:
        parse_policy(cfg.policy, cfg.seed, ENGINE_STREAMS)
    except PolicyError as e:
        raise ParamError(str(e), "policy") from None
    unknown = sorted(set(cfg.faults) - set(CATALOGUE))
    if unknown:
        raise ParamError(f"unknown fault {', '.join(unknown)}; known: {', '.join(CATALOGUE)}", "faults")
    import dataclasses
    for f in dataclasses.fields(cfg.costs):
        v = getattr(cfg.costs, f.name)
        check_value(f"costs.{f.name}", v, Range(1, 1 << 10, integer=True) if f.name == "launches_per_step"
                    else Range(0.0, 1e6), label)
