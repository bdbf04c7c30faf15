"""Targets the suites attack. `ref` (the embedded engine) is the one built so far; the white-box
suites need its streams and tables. Any OpenAI-compatible pair of endpoints is attacked by the
GSM8K gate (`overlap-harness gsm8k --target openai`); an SGLang adapter is future work."""
from __future__ import annotations

TARGETS = ("ref",)


def make_target(name: str, faults=frozenset(), **kw):
    if name == "ref":
        from harness.targets.ref import RefTarget
        return RefTarget(faults=frozenset(faults), **kw)
    raise ValueError(f"unknown target {name!r}: expected one of {', '.join(TARGETS)} "
                     f"(for OpenAI-compatible servers use `overlap-harness gsm8k --target openai`)")
