"""Targets the suites attack. `ref` (the embedded engine) is white-box: every suite. `vllm` is
a real engine (its OpenAI server, async scheduling on and off, our agent inside it): the
black-box suites; `sglang` likewise on GPU runners. Any OpenAI-compatible pair of endpoints is attacked by the GSM8K gate
(`overlap-harness gsm8k --target openai`)."""
from __future__ import annotations

from dataclasses import dataclass, field

TARGETS = ("ref", "vllm", "sglang")


@dataclass(frozen=True)
class VllmChoice:
    """The vLLM the flags name, checked once (harness.flags.vllm_choice): a release of the table
    (None: the pinned one) or a Python of the user's, and the model runner asked for."""
    version: str | None = None
    python: str | None = None
    runner: str = "auto"
    # the user's vLLM as probed once from `python` (harness.targets.vllm.build.Build): carried to the
    # target, which reads its release and commit from it instead of probing that Python again
    build: object = None
    isa: str = ""  # --vllm-isa's library forced on the servers ("": this CPU's own)

    def kw(self) -> dict:
        """VllmTarget's switches (only those given)."""
        return {k: v for k, v in (("version", self.version), ("vllm_python", self.python),
                                  ("runner", None if self.runner == "auto" else self.runner),
                                  ("user_build", self.build), ("isa", self.isa)) if v}


@dataclass(frozen=True)
class ServedOptions:
    """What a command's flags give a served target, for every pair of the run (built once from the
    flags: harness.flags.served_options); the suites ask for a target by name only."""
    model: str | None = None
    extra_args: tuple = ()
    logits_processors: tuple = ()
    out_dir: str | None = None  # where a HANG's report and the like outlive the servers' work folder
    config: str | None = None  # a server configuration of the matrix (harness.targets.vllm.configs)
    vllm: VllmChoice = field(default_factory=VllmChoice)

    def kw(self, name: str) -> dict:
        kw = {"extra_args": list(self.extra_args)} if self.extra_args else {}
        for k in ("model", "out_dir", "config"):
            if getattr(self, k):
                kw[k] = getattr(self, k)
        if self.logits_processors:
            kw["logits_processors"] = list(self.logits_processors)
        return {**kw, **self.vllm.kw()} if name == "vllm" else kw


class Pairs:
    """The served pairs of one run (a check, a stress, a test): one per target, model, setting (the
    bare pair) and server configuration, reused by every suite of the run; each target's options
    given once, at the start. The run closes it at its end (every server stops)."""

    def __init__(self, options: dict[str, ServedOptions] | None = None):
        self.options = dict(options or {})
        self._pairs: dict[tuple, object] = {}

    def get(self, name: str, faults=frozenset(), **kw):
        """The pair of `name` (started on first use; its faults set for this suite)."""
        kw = {**self.options.get(name, ServedOptions()).kw(name), **kw}
        key = served_key(name, kw)
        t = self._pairs.get(key)
        if t is None:
            if name == "vllm":
                from harness.targets.vllm.target import VllmTarget as cls
            else:
                from harness.targets.sglang.target import SglangTarget as cls
            t = self._pairs[key] = cls(faults=frozenset(faults), **kw)
        elif t.faults != frozenset(faults):  # faults live in the agent's plan: no restart needed
            old, t.faults = t.faults, frozenset(faults)
            t.revive()  # a server the watchdog stopped (HANG) starts again for the new faults
            t.refresh_faults(old)  # vLLM's source patches restart the async-on server; SGLang's plan
        return t

    def pair(self, name: str):
        """The main pair of `name` as the suites left it (its faults untouched), None if none ran."""
        kw = self.options.get(name, ServedOptions()).kw(name)
        return self._pairs.get(served_key(name, kw))

    def close(self) -> None:
        from harness.targets.served.process import stop_each
        # every pair's servers at once (a gate holds up to three pairs: their shutdowns overlap)
        stop_each([s for t in self._pairs.values() for s in t.servers.values()])
        for t in list(self._pairs.values()):
            t.close()
        self._pairs.clear()

    def __enter__(self) -> "Pairs":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def served_key(name: str, kw: dict) -> tuple:
    """A pair per model (the GSM8K gate serves another one), per setting (the bare pair) and per
    server configuration (harness.targets.vllm.configs)."""
    return (name, kw.get("model")) + ((kw["pair"],) if kw.get("pair", "main") != "main" else ()) + (
        (kw["config"],) if kw.get("config") not in (None, "default") else ())


def make_target(name: str, faults=frozenset(), pairs: Pairs | None = None, **kw):
    """The target `name`: the ref engine (built here), or a served pair of `pairs` (the run's)."""
    if name == "ref":
        from harness.targets.ref import RefTarget
        return RefTarget(faults=frozenset(faults), **kw)
    if name in ("vllm", "sglang"):
        if pairs is None:
            raise ValueError(f"target {name} is a pair of servers: ask the run's Pairs for it")
        return pairs.get(name, faults, **kw)
    raise ValueError(f"unknown target {name!r}: expected one of {', '.join(TARGETS)} "
                     f"(for OpenAI-compatible servers use `overlap-harness gsm8k --target openai`)")


def fault_catalogue(name: str) -> dict:
    """The faults a target can be given: the ref engine's, or its agent's."""
    if name == "vllm":  # the agent's switches, then source patches of vLLM's own code
        from harness.agents.vllm.patches import PATCHES
        from harness.agents.vllm.points import CATALOGUE
        return {**CATALOGUE, **PATCHES}
    if name == "sglang":  # the agent's switches, then source patches of SGLang's own code
        from dataclasses import replace

        from harness.agents.sglang.patches import PATCHES
        from harness.agents.sglang.points import CATALOGUE
        from harness.targets.vllm.setup import has_cuda
        if has_cuda():  # every agent fault acts on the GPU's streams: shown where a CUDA device is visible
            return {**{n: replace(f, device_only="") for n, f in CATALOGUE.items()}, **PATCHES}
        return {**CATALOGUE, **PATCHES}
    from harness.faults import CATALOGUE
    return CATALOGUE


def check_fault_names(target: str, names, exc=ValueError) -> None:
    unknown = sorted(set(names) - set(fault_catalogue(target)))
    if unknown:
        raise exc(f"unknown fault {', '.join(unknown)} for target {target}; known: "
                  f"{', '.join(fault_catalogue(target))}")
