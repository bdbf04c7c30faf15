"""Schedule policies for the simulated device: which ready op runs next.

`serial` runs ops as they are issued (the order nothing goes wrong in);
`delay` runs them in virtual-time order with one stream held back by
`amount` ms per op (as the cuda device spins the GPU); `random` and `pct`
let queued work pile up and pick among the ready ops from a seed, so orders
the hardware allows but rarely shows are provoked and replayed exactly.
"""
from __future__ import annotations

import math
import random as _random



class Policy:
    name = "base"
    time_ordered = False  # run ops by virtual start time as the host clock advances

    def delay_for(self, stream: str) -> float:
        return 0.0

    def pick(self, ready: list) -> object:
        raise NotImplementedError

    def budget(self) -> int:
        """How many ready ops to run at a host interaction that does not block (-1: all)."""
        return -1

    def spec(self) -> str:
        return self.name


class Serial(Policy):
    name = "serial"

    def pick(self, ready):
        return min(ready, key=lambda p: p.rec.id)


class Delay(Policy):
    name = "delay"
    time_ordered = True

    def __init__(self, stream: str = "forward", amount: float = 1.0):
        self.stream, self.amount = stream, float(amount)

    def delay_for(self, stream):
        return self.amount if stream == self.stream else 0.0

    def pick(self, ready):
        return min(ready, key=lambda p: (p.rec.start, p.rec.id))

    def spec(self):
        return f"delay:{self.stream}:{self.amount:g}"


class Random(Policy):
    name = "random"

    def __init__(self, seed: int):
        self.seed = seed
        self.rng = _random.Random(seed)

    def pick(self, ready):
        ready = sorted(ready, key=lambda p: p.rec.id)
        return ready[self.rng.randrange(len(ready))]

    def budget(self):
        return self.rng.randrange(3)

    def spec(self):
        return f"random:{self.seed}"


class PCT(Policy):
    """Probabilistic concurrency testing (Burckhardt et al.): random stream
    priorities with depth-1 priority change points over the first `horizon` ops."""

    name = "pct"

    def __init__(self, seed: int, depth: int = 3, horizon: int = 400):
        self.seed, self.depth, self.horizon = seed, depth, horizon
        self.rng = _random.Random(seed)
        self.prio: dict[str, float] = {}
        self.changes = sorted(self.rng.sample(range(1, horizon), max(0, depth - 1)))
        self.executed = 0

    def _p(self, stream: str) -> float:
        if stream not in self.prio:
            self.prio[stream] = self.rng.random() + 1.0
        return self.prio[stream]

    def pick(self, ready):
        best = max(ready, key=lambda p: (self._p(p.rec.stream), -p.rec.id))
        self.executed += 1
        if self.changes and self.executed == self.changes[0]:
            self.changes.pop(0)
            self.prio[best.rec.stream] = -float(self.executed)  # drop it below every other stream
        return best

    def budget(self):
        return 0

    def spec(self):
        return f"pct:{self.seed}:{self.depth}"


POLICY_NAMES = ("serial", "random", "pct", "delay")
# The streams the reference engine creates (engine/loop.py; "admit" only under the
# unfenced_row_reuse fault): a delay on any other name would hold back nothing, so the
# CLI refuses it rather than run an unprovoked schedule the user thinks is provoked.
ENGINE_STREAMS = ("schedule", "forward", "copy", "admit")
USAGE = "serial | random[:SEED] | pct[:SEED[:DEPTH]] | delay[:STREAM[:MS]]"


class PolicyError(ValueError):
    pass


def _int(spec: str, what: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise PolicyError(f"bad policy {spec!r}: {what} must be an integer, got {text!r}") from None


def parse_policy(spec: str, seed: int = 0, streams: tuple[str, ...] | None = None) -> Policy:
    """serial | random[:SEED] | pct[:SEED[:DEPTH]] | delay[:STREAM[:MS]]; with `streams`, a
    delay must name one of them. Every value is checked: PolicyError says which is wrong."""
    parts = spec.split(":")
    kind, args = parts[0], parts[1:]
    if kind == "serial" and not args:
        return Serial()
    if kind == "random" and len(args) <= 1:
        return Random(_int(spec, "the seed", args[0]) if args else seed)
    if kind == "pct" and len(args) <= 2:
        s = _int(spec, "the seed", args[0]) if args else seed
        depth = _int(spec, "the depth", args[1]) if len(args) > 1 else 3
        horizon = 400
        if not 1 <= depth <= horizon - 1:  # depth - 1 change points among the first horizon ops
            raise PolicyError(f"bad policy {spec!r}: the depth must be between 1 and {horizon - 1}, got {depth}")
        return PCT(s, depth, horizon)
    if kind == "delay" and len(args) <= 2:
        stream = args[0] if args else "forward"
        if not stream or (streams is not None and stream not in streams):
            raise PolicyError(f"bad policy {spec!r}: no stream {stream!r}; the engine's streams are "
                              f"{', '.join(streams or ())}")
        ms = 1.0
        if len(args) > 1:
            try:
                ms = float(args[1])
            except ValueError:
                raise PolicyError(f"bad policy {spec!r}: the delay must be a number of ms, "
                                  f"got {args[1]!r}") from None
            if not math.isfinite(ms) or ms < 0:
                raise PolicyError(f"bad policy {spec!r}: the delay must be a finite number of ms >= 0, "
                                  f"got {args[1]}")
        return Delay(stream, ms)
    raise PolicyError(f"bad policy {spec!r}: expected {USAGE}")
