"""Targets the suites attack. `ref` (the embedded engine) is white-box: every suite. `vllm` is
a real engine (its OpenAI server, async scheduling on and off, our agent inside it): the
black-box suites; `sglang` likewise on GPU runners. Any OpenAI-compatible pair of endpoints is attacked by the GSM8K gate
(`overlap-harness gsm8k --target openai`)."""
from __future__ import annotations

TARGETS = ("ref", "vllm", "sglang")
_SERVED: dict[tuple, object] = {}
_DEFAULTS: dict[str, dict] = {}  # what `check --served-model/--server-arg` gave, for every suite


def configure(name: str, **kw) -> None:
    """Switches every later make_target(name) gets (the suites ask by name only)."""
    _DEFAULTS[name] = kw


def close_served() -> None:
    from harness.targets.served.process import stop_each
    # every pair's servers at once (a gate holds up to three pairs: their shutdowns overlap)
    stop_each([s for t in _SERVED.values() for s in getattr(t, "servers", {}).values()])
    for t in list(_SERVED.values()):
        t.close()
    _SERVED.clear()  # one server pair per process: every suite of a check reuses it


def served_key(name: str, kw: dict) -> tuple:
    """A pair per model (the GSM8K gate serves another one), per setting (the bare pair) and per
    server configuration (harness.targets.vllm.configs)."""
    return (name, kw.get("model")) + ((kw["pair"],) if kw.get("pair", "main") != "main" else ()) + (
        (kw["config"],) if kw.get("config") not in (None, "default") else ())


def make_target(name: str, faults=frozenset(), **kw):
    if name == "ref":
        from harness.targets.ref import RefTarget
        return RefTarget(faults=frozenset(faults), **kw)
    if name in ("vllm", "sglang"):
        kw = {**_DEFAULTS.get(name, {}), **kw}
        # a pair per model (the GSM8K gate serves another one) and per setting (the bare pair)
        key = served_key(name, kw)
        t = _SERVED.get(key)
        if t is None:
            if name == "vllm":
                from harness.targets.vllm.target import VllmTarget as cls
            else:
                from harness.targets.sglang.target import SglangTarget as cls
            t = _SERVED[key] = cls(faults=frozenset(faults), **kw)
        elif t.faults != frozenset(faults):  # faults live in the agent's plan: no restart needed
            old, t.faults = t.faults, frozenset(faults)
            t.revive()  # a server the watchdog stopped (HANG) starts again for the new faults
            if hasattr(t, "refresh_faults"):  # vLLM's source patches restart the async-on server
                t.refresh_faults(old)
            elif True in t.servers:
                t.set_plan(True)
        return t
    raise ValueError(f"unknown target {name!r}: expected one of {', '.join(TARGETS)} "
                     f"(for OpenAI-compatible servers use `overlap-harness gsm8k --target openai`)")


def fault_catalogue(name: str) -> dict:
    """The faults a target can be given: the ref engine's, or its agent's."""
    if name == "vllm":  # the agent's switches, then source patches of vLLM's own code
        from harness.agents.vllm.patches import PATCHES
        from harness.agents.vllm.points import CATALOGUE
        return {**CATALOGUE, **PATCHES}
    if name == "sglang":  # the agent's switches, then source patches of SGLang's own code
        from harness.agents.sglang_patches import PATCHES
        from harness.agents.sglang_points import CATALOGUE
        return {**CATALOGUE, **PATCHES}
    from harness.faults import CATALOGUE
    return CATALOGUE


def check_fault_names(target: str, names, exc=ValueError) -> None:
    unknown = sorted(set(names) - set(fault_catalogue(target)))
    if unknown:
        raise exc(f"unknown fault {', '.join(unknown)} for target {target}; known: "
                  f"{', '.join(fault_catalogue(target))}")
