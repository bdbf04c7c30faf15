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
    hi: float
    lo_open: bool = False  # lo itself is refused (top_p 0 would keep no token)
    integer: bool = False

    def describe(self) -> str:
        if self.hi == INT64[1] and self.lo == INT64[0]:
            return "a 64-bit integer"
        lo, hi = (f"{x:g}" if isinstance(x, float) else str(x) for x in (self.lo, self.hi))
        return f"> {lo} and <= {hi}" if self.lo_open else f"between {lo} and {hi}"

    def holds(self, v) -> bool:
        if isinstance(v, float) and not math.isfinite(v):
            return False
        return (self.lo < v if self.lo_open else self.lo <= v) and v <= self.hi


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
