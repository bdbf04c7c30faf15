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
    # the engine release in force (a vLLM pair's, read from its install); None: not a versioned
    # engine, or not known (a known-upstream entry then counts as live)
    version: str | None = None

    def run(self, reqs, *, overlap: bool = True, policy: str = "serial", seed: int = 0, track: bool = False,
            **engine_kw) -> Run:
        raise NotImplementedError


# What a target raises (a served one in particular): its cases report them by name.
class TargetUnavailable(RuntimeError):
    """The target cannot start: missing setup, a server that died, a health timeout (one line)."""


class TargetError(RuntimeError):
    """The target started but misbehaved (e.g. overlap was requested and did not take effect)."""


class AgentFault(TargetError):
    """The harness's own agent misbehaved inside the engine (e.g. its sampled-id copy handed vLLM
    another step's ids): the run is not judged, and never reported as the engine's finding."""


class TargetHang(TargetError):
    """A run made no progress within the watchdog's bound: the server was dumped and stopped."""


class TargetCrash(TargetError):
    """A server died under a run: a finding of its own (arm, exit code, case, the engine's traceback)."""
