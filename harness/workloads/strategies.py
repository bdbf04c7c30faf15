"""Hypothesis strategies for workloads, engine switches and schedule policies.

The equivalence suite draws workloads from here, and `overlap-harness stress` explores and
shrinks `Case`s (engine switches x schedule policy x requests). Every strategy shrinks
toward the plain case: one short greedy request, no stop string, no abort, no pressure,
the serial schedule; so a shrunk failure keeps only what it needs.

A workload covers: arrival times, prompt and output lengths, shared prefixes, stop strings,
max tokens, aborts, seeded sampling, repetition penalty, and (through a small KV pool)
pressure that forces retraction.
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field

from hypothesis import strategies as st

from harness.engine.request import Request
from harness.workloads.presets import WORDS

PREFIXES = ("You are a careful assistant. ", "Answer about the slot table: ", "Q: ")
ALPHABET = string.ascii_letters + string.digits + " ?.,"
STOPS = tuple("aeiou.ts ") + ("ab", "the")
POLICY_KINDS = ("serial", "delay", "pct", "random")  # simplest first: shrinking moves left


def drafters(model: str = "tiny") -> tuple[str, ...]:
    """Speculative drafters the engine offers for `model` (none before EngineConfig has `spec`)."""
    import dataclasses
    from harness.engine.config import EngineConfig
    if "spec" not in {f.name for f in dataclasses.fields(EngineConfig)}:
        return ()
    try:
        from harness.engine.spec import DRAFTERS, FIXTURES
    except ImportError:
        return ()
    return tuple(d for d in DRAFTERS if d != "mtp" or (FIXTURES / f"{model}_mtp.pt").exists())


@dataclass
class Case:
    """One thing stress runs: engine switches, a schedule policy, and a workload."""

    engine: dict = field(default_factory=dict)  # EngineConfig switches (max_running, pool_slots, ...)
    policy: str = "serial"
    requests: list[Request] = field(default_factory=list)

    def __repr__(self) -> str:
        reqs = ", ".join(f"{r.rid}(prompt {len(r.prompt_ids)}, max {r.max_new_tokens})" for r in self.requests)
        return f"Case(engine={self.engine}, policy={self.policy!r}, requests=[{reqs}])"


def _hundredths(lo: int, hi: int):
    return st.integers(lo, hi).map(lambda x: x / 100)


def _ids(tok, text: str) -> list[int]:
    ids = list(tok.encode(text))
    bos = getattr(tok, "bos_id", None)
    return ([bos] if bos is not None else []) + ids


@st.composite
def requests(draw, tok, min_size: int = 1, max_size: int = 6, max_new: int = 24,
             max_arrival: int = 8, penalty: bool = True) -> list[Request]:
    """A list of requests; each field shrinks toward the plain greedy request."""
    n = draw(st.integers(min_size, max_size))
    prefix = draw(st.sampled_from(PREFIXES))
    out = []
    for i in range(n):
        shared = draw(st.booleans())
        words = draw(st.lists(st.sampled_from(WORDS), max_size=3))
        text = draw(st.text(ALPHABET, min_size=0 if (shared or words) else 1, max_size=12))
        prompt = (prefix if shared else "") + " ".join(words) + text
        if not prompt:
            prompt = "x"
        mt = draw(st.integers(1, max_new))
        r = Request(rid=f"r{i}", prompt_ids=_ids(tok, prompt), max_new_tokens=mt)
        r.arrival = draw(st.integers(0, max_arrival))
        if draw(st.booleans()):
            r.stop = tuple(draw(st.lists(st.sampled_from(STOPS), min_size=1, max_size=2, unique=True)))
        if draw(st.booleans()):
            r.abort_after = draw(st.integers(1, mt))
        if draw(st.booleans()):
            r.temperature = draw(_hundredths(30, 150))
            r.top_p = draw(_hundredths(50, 100))
            r.seed = draw(st.one_of(st.none(), st.integers(0, 2 ** 31 - 1)))
        if penalty and draw(st.booleans()):
            r.repetition_penalty = draw(_hundredths(105, 200))
        out.append(r)
    return out


def need_slots(r: Request, page_size: int, window: int = 1) -> int:
    """KV slots one request needs to run alone (what Engine.check_fits asks of the pool: prompt,
    output, and three windows, since an extra step may run a window past an overshooting count)."""
    pos = len(r.prompt_ids) + r.max_new_tokens + 3 * window + 1
    return -(-pos // page_size) * page_size


def spec_switches(model: str = "tiny"):
    """{} (plain decoding) or {"spec": drafter, "spec_k": k}, each drafter as likely as plain
    decoding (the speculative faults need their drafter); plain shrinks first."""
    algos = drafters(model)
    if not algos:
        return st.just({})
    return st.sampled_from((None,) + algos).flatmap(
        lambda a: st.just({}) if a is None else st.integers(1, 4).map(lambda k: {"spec": a, "spec_k": k}))


@st.composite
def engine_switches(draw, reqs: list[Request], max_running: int = 4, spec: dict | None = None) -> dict:
    """max_running, page size, prefix cache, and optionally a pool small enough to retract."""
    kw = {"max_running": draw(st.integers(1, max_running))}
    ps = draw(st.sampled_from((1, 2, 4)))
    if ps != 1:
        kw["page_size"] = ps
    if draw(st.booleans()):
        kw["prefix_cache"] = False
    window = spec["spec_k"] + 1 if spec else 1
    if draw(st.booleans()):  # pressure: room for the largest request plus a few pages
        biggest = max(need_slots(r, ps, window) for r in reqs)
        kw["pool_slots"] = biggest + ps * (1 + draw(st.integers(0, 12)))
    kw.update(spec or {})
    return kw


def policies(kinds=POLICY_KINDS):
    """Schedule policy specs: serial | delay:STREAM:MS | pct:SEED:DEPTH | random:SEED."""
    kinds = tuple(kinds)
    opts = []
    if "serial" in kinds:
        opts.append(st.just("serial"))
    if "delay" in kinds:
        opts.append(st.builds(lambda s, ms: f"delay:{s}:{ms}", st.sampled_from(("forward", "copy", "schedule")),
                              st.integers(1, 8)))
    if "pct" in kinds:
        opts.append(st.builds(lambda s, d: f"pct:{s}:{d}", st.integers(0, 10 ** 6), st.integers(1, 4)))
    if "random" in kinds:
        opts.append(st.builds(lambda s: f"random:{s}", st.integers(0, 10 ** 6)))
    if not opts:
        raise ValueError(f"no schedule policy among {kinds}: expected some of {', '.join(POLICY_KINDS)}")
    return st.one_of(*opts)


@st.composite
def workloads(draw, tok, max_requests: int = 6, max_running: int = 4, spec: bool | None = None,
              model: str = "tiny") -> tuple[list[Request], dict]:
    """(requests, engine switches): what the equivalence suite runs overlap on and off.
    spec: None explores plain and speculative decoding, False plain only, True speculative only."""
    if spec is False:
        sw = {}
    elif spec is True:
        algos = drafters(model)
        if not algos:
            raise ValueError("speculative decoding is not available (EngineConfig has no `spec`)")
        sw = draw(st.builds(lambda a, k: {"spec": a, "spec_k": k}, st.sampled_from(algos), st.integers(1, 4)))
    else:
        sw = draw(spec_switches(model))
    reqs = draw(requests(tok, max_size=max_requests, penalty=not sw))  # no penalty with speculative decoding
    return reqs, draw(engine_switches(reqs, max_running, sw))


@st.composite
def cases(draw, tok, kinds=POLICY_KINDS, max_requests: int = 6, max_running: int = 4, spec: bool | None = None,
          model: str = "tiny") -> Case:
    reqs, kw = draw(workloads(tok, max_requests, max_running, spec, model))
    return Case(kw, draw(policies(kinds)), reqs)
