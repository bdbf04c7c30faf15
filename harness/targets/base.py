"""What every target gives a suite: generate token ids for a workload, overlap on and off."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Run:
    """One run of a workload on a target."""

    outputs: list[tuple[str, list[int], str | None]]  # (request id, token ids, finish reason)
    engine: object = None  # ref only: the Engine, for white-box suites
    tracker: object = None  # ref only: the AccessTracker, when tracking was asked for
    summary: dict = field(default_factory=dict)

    @property
    def hazards(self) -> list:
        return self.tracker.hazards if self.tracker is not None else []


class Target:
    name = "base"
    white_box = False  # internals (streams, tables) visible: the races/ suites need this

    def run(self, reqs, *, overlap: bool = True, policy: str = "serial", seed: int = 0, track: bool = False,
            **engine_kw) -> Run:
        raise NotImplementedError
