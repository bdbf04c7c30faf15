"""Vector clocks: one component per stream and one for the host.

The device layer advances them in program order (issue order plus the
synchronisation calls), never from timing, so happens-before is decided the
same way whichever order a schedule policy runs the ops in.
"""
from __future__ import annotations


class VectorClock:
    __slots__ = ("c",)

    def __init__(self, c: dict[str, int] | None = None):
        self.c = dict(c) if c else {}

    def tick(self, who: str) -> None:
        self.c[who] = self.c.get(who, 0) + 1

    def join(self, other: "VectorClock") -> None:
        for k, v in other.c.items():
            if v > self.c.get(k, 0):
                self.c[k] = v

    def copy(self) -> "VectorClock":
        return VectorClock(self.c)

    def get(self, who: str) -> int:
        return self.c.get(who, 0)

    def __le__(self, other: "VectorClock") -> bool:
        return all(v <= other.c.get(k, 0) for k, v in self.c.items())

    def __repr__(self) -> str:
        return "VC(" + ", ".join(f"{k}={v}" for k, v in sorted(self.c.items())) + ")"


def happens_before(a_who: str, a_clock: VectorClock, b_clock: VectorClock) -> bool:
    """Op a (on thread a_who, stamped a_clock) happens before op b (stamped b_clock)
    iff b's clock has seen a's own component (the epoch test of FastTrack)."""
    return a_clock.get(a_who) <= b_clock.get(a_who)
