"""Targets the suites attack: `ref` (the embedded engine), `sglang`, `openai`."""
from __future__ import annotations

TARGETS = ("ref", "sglang", "openai")


def make_target(name: str, faults=frozenset(), **kw):
    if name == "ref":
        from harness.targets.ref import RefTarget
        return RefTarget(faults=frozenset(faults), **kw)
    raise ValueError(f"unknown target {name!r}: expected one of {', '.join(TARGETS)}")
