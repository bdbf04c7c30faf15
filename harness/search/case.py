"""Run one case: a workload under one engine config and schedule policy, and what failed
(a hazard, a slot-ownership or scheduler-invariant violation, tokens that diverge from the
reference runs, a crash, or a hang)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from harness.workloads.strategies import Case

DETECT = ("all", "hazards", "tokens")


@dataclass
class Execution:
    outputs: list  # (rid, token ids, finish reason)
    logprobs: dict  # rid -> output_logprobs
    token_steps: dict  # rid -> the step that produced each output token
    engine: object = None
    hazards: list = field(default_factory=list)
    violations: list = field(default_factory=list)  # the scheduler's own invariant checks (reservation)
    ownership: list = field(default_factory=list)  # device-side slot ownership (harness.hazards.ownership)
    leaks: list = field(default_factory=list)  # conservation findings (harness.oracles.conservation)


def execute(case: Case, *, faults=frozenset(), overlap=True, policy=None, seed=0, model="tiny",
            track=False) -> Execution:
    """Run a case on a fresh engine; requests are cloned, the case is left as it was."""
    from harness.engine.build import build_engine
    from harness.engine.config import Costs, EngineConfig
    from harness.oracles import conservation
    from harness.workloads.presets import clone
    kw = dict(case.engine)
    if isinstance(kw.get("costs"), dict):
        kw["costs"] = Costs(**kw["costs"])
    kw.setdefault("model", model)
    cfg = EngineConfig(**{**kw, "overlap": overlap, "policy": policy or case.policy, "seed": seed,
                          "faults": frozenset(faults)})
    eng, _ = build_engine(cfg)
    tracker = None
    if track:
        from harness.hazards.tracking import AccessTracker
        from harness.hazards.ownership import KV_PREFIXES
        tracker = AccessTracker(eng.dev, log=KV_PREFIXES)  # the KV log: for the slot-ownership check
        eng.dev.tracker = tracker
    steps: dict[str, list[int]] = {}
    process = eng.sched.process

    def process_and_note(batch, tokens, logprobs=None):  # which step produced each token
        updated = process(batch, tokens, logprobs)
        for r in updated:
            steps.setdefault(r.rid, []).append(batch.step)
        return updated
    eng.sched.process = process_and_note
    reqs = clone(case.requests)
    for r in reqs:
        why = eng.check_fits(r)
        if why:
            raise DoesNotFit(why)
    limit = step_limit(reqs)

    rounds = [0]

    def guard(e):
        rounds[0] += 1
        if e.steps > limit:
            raise Hang(f"the engine ran {e.steps} steps, past the limit of {limit} for this workload "
                       f"({sum(not r.finished for r in reqs)} request(s) unfinished)")
        if rounds[0] > 2 * limit:  # rounds that launch nothing (no batch can be formed) count too
            raise Hang(f"the engine made no progress: {rounds[0]} rounds of its loop for {e.steps} steps "
                       f"({sum(not r.finished for r in reqs)} request(s) unfinished)")
    eng.run(reqs, on_step=guard)
    if tracker is not None:
        tracker.flush()
    return Execution([(r.rid, list(r.output_ids), r.finish_reason) for r in reqs],
                     {r.rid: list(r.output_logprobs) for r in reqs}, steps, eng,
                     list(tracker.hazards) if tracker is not None else [],
                     list(getattr(eng.sched, "violations", ())),
                     _ownership(tracker), conservation.findings(eng))


def _ownership(tracker) -> list:
    if tracker is None:
        return []
    from harness.hazards.ownership import check as ownership_check
    return ownership_check(tracker.log)


class Hang(RuntimeError):
    """The engine kept stepping far past what the workload needs (a livelock, or a loop that
    corrupted state keeps alive); raised so one run cannot hold stress forever."""


def step_limit(reqs) -> int:
    """Generous: every token 20 times over (retraction recomputes), plus the arrivals."""
    return 20 * sum(r.max_new_tokens + 1 for r in reqs) + 2 * max((r.arrival for r in reqs), default=0) + 100


class DoesNotFit(ValueError):
    """A request of the case can never run on its engine (Engine.check_fits)."""


@dataclass
class Failure:
    kind: str  # "hazard" | "divergence" | "violation" | "crash" | "hang"
    summary: str  # one line
    step: int | None
    signature: tuple  # what must stay the same while shrinking and on replay
    detail: str = ""
    ops: tuple = ()  # op ids to mark on the timeline (a hazard's two accesses)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "summary": self.summary, "step": self.step, "signature": list(self.signature),
                "detail": self.detail}


def _hazard_failure(h) -> Failure:
    from harness.hazards.report import format_hazard
    text = format_hazard(h)
    head = text.splitlines()[0]
    ops = tuple(x for x in (h.first.op_id, h.second.op_id) if x is not None)
    return Failure("hazard", f"{head} (step {h.step})", h.step, ("hazard", h.kind, h.buffer), text, ops)


def _exact(got: Execution) -> bool:
    """Whether tokens may be compared exactly: the engine's batch invariance was verified here."""
    inv = getattr(got.engine, "invariance", None)
    return inv is None or inv.ok


def _divergence_failure(ref: Execution, got: Execution, policy: str,
                        against: str = "the serial overlap-off run") -> Failure | None:
    from harness.oracles.divergence import compare
    divs = compare(ref.outputs, got.outputs, ref.logprobs, got.logprobs,
                   labels=("alone" if against.startswith("the absolute") else "overlap off", "overlap on"))
    if not _exact(got):  # rounding moves with the batch here: a numerical tie is not a failure
        divs = [d for d in divs if not d.near_tie]
    if not divs:
        return None
    d = divs[0]
    steps = got.token_steps.get(d.rid) or ref.token_steps.get(d.rid) or []
    step = steps[min(d.position, len(steps) - 1)] if steps else None
    summary = (f"request {d.rid} diverges at token {d.position} under overlap and {policy} from {against}: "
               f"expected {d.expected[:6]} got {d.got[:6]}" + (f" (step {step})" if step is not None else ""))
    detail = "\n".join(x.describe() for x in divs)
    return Failure("divergence", summary, step, ("divergence",), detail)


def check(case: Case, *, faults=frozenset(), seed=0, model="tiny", detect="all",
          keep: bool = False) -> tuple[Failure | None, Execution | None]:
    """Run a case under its policy with overlap on; (failure or None, the run under test)."""
    got = None
    try:
        got = execute(case, faults=faults, seed=seed, model=model, track=detect in ("all", "hazards"))
        if got.hazards:
            return _hazard_failure(got.hazards[0]), got
        if got.ownership:
            v = got.ownership[0]
            return Failure("violation", f"slot ownership: {v}"[:300], v.step, ("violation", "ownership"),
                           "\n".join(map(str, got.ownership[:10]))), got
        if got.violations:
            v = got.violations[0]
            m = re.match(r"step (\d+)", v)
            return Failure("violation", f"scheduler invariant violated: {v}"[:300], int(m.group(1)) if m else None,
                           ("violation",), "\n".join(got.violations[:10])), got
        if got.leaks:  # the engine's books, after every step and at idle (harness/oracles/conservation.py)
            v = got.leaks[0]
            return Failure("violation", f"conservation: {v}"[:300], v.step, ("violation", "conservation", v.resource),
                           "\n".join(map(str, got.leaks))), got
        if detect == "hazards":
            return None, got
        ref = execute(case, faults=(), overlap=False, policy="serial", seed=seed, model=model)
        found = _divergence_failure(ref, got, case.policy)
        if found is None and _exact(got):  # the absolute reference, each request alone: sees a bug both runs
            # share (exact only on a batch-invariant engine)
            from harness.oracles.reference import ABSOLUTE
            alone = Case({**case.engine, "max_running": 1}, "serial", case.requests)
            found = _divergence_failure(execute(alone, overlap=False, seed=seed, model=model), got, case.policy,
                                        ABSOLUTE)
        return found, got
    except (KeyboardInterrupt, MemoryError, DoesNotFit):
        raise
    except Exception as e:  # the engine broke: a failure too
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        from harness.engine.loop import EngineHang
        if isinstance(e, (Hang, EngineHang)):  # ours, or the engine's own watchdog
            return Failure("hang", msg, None, ("hang",), msg), got
        return Failure("crash", f"{type(e).__name__}: {msg}"[:300], None, ("crash", type(e).__name__),
                       repr(e)), got
