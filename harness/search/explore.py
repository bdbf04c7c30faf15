"""`overlap-harness stress` and `overlap-harness replay`.

stress explores cases (engine switches x schedule policy x workload, drawn by hypothesis from
`harness.strategies`) against the ref engine until its time is spent. A case fails when

- the access tracker reports a hazard (decided by happens-before from program order, so it
  fires whatever the schedule: the fast detector for ordering faults), or
- its tokens under overlap and the case's schedule policy differ from the reference run of
  the same workload: the same engine switches without any fault, overlap off, serial
  (what the tokens must be), or
- the engine raises.

The first failure is shrunk by hypothesis to a minimal case that fails the same way, and
written as a JSON reproducer with a Chrome trace and a PNG timeline around the failing step.
`replay` runs a reproducer again, bit for bit (the simulated device is deterministic).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from harness.engine.request import Request
from harness.strategies import POLICY_KINDS, Case, cases

FORMAT = "overlap-harness-repro"
VERSION = 1
DETECT = ("all", "hazards", "tokens")
EXIT_FOUND, EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 130, 143  # 128 + SIGINT / SIGTERM
BURST = 10  # examples per hypothesis search before a fresh seed


def harness_version() -> str:
    try:
        from importlib.metadata import version
        return version("overlap-harness")
    except Exception:  # not installed (a checkout on sys.path)
        return "unknown"


# -- running one case --------------------------------------------------------------------
@dataclass
class Execution:
    outputs: list  # (rid, token ids, finish reason)
    logprobs: dict  # rid -> output_logprobs
    token_steps: dict  # rid -> the step that produced each output token
    engine: object = None
    hazards: list = field(default_factory=list)
    violations: list = field(default_factory=list)  # the scheduler's own invariant checks (reservation)
    ownership: list = field(default_factory=list)  # device-side slot ownership (harness.hazards.ownership)


def execute(case: Case, *, faults=frozenset(), overlap=True, policy=None, seed=0, model="tiny",
            track=False) -> Execution:
    """Run a case on a fresh engine; requests are cloned, the case is left as it was."""
    from harness.engine.build import build_engine
    from harness.engine.config import Costs, EngineConfig
    from harness.workloads import clone
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
                     _ownership(tracker))


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
    from harness.divergence import compare
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
        if detect == "hazards":
            return None, got
        ref = execute(case, faults=(), overlap=False, policy="serial", seed=seed, model=model)
        found = _divergence_failure(ref, got, case.policy)
        if found is None and _exact(got):  # the absolute reference, each request alone: sees a bug both runs
            # share (exact only on a batch-invariant engine)
            from harness.reference import ABSOLUTE
            alone = Case({**case.engine, "max_running": 1}, "serial", case.requests)
            found = _divergence_failure(execute(alone, overlap=False, seed=seed, model=model), got, case.policy,
                                        ABSOLUTE)
        return found, got
    except (KeyboardInterrupt, MemoryError, DoesNotFit):
        raise
    except Exception as e:  # the engine broke: a failure too
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if isinstance(e, Hang):
            return Failure("hang", msg, None, ("hang",), msg), got
        return Failure("crash", f"{type(e).__name__}: {msg}"[:300], None, ("crash", type(e).__name__),
                       repr(e)), got


# -- reproducers -------------------------------------------------------------------------
REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(Request)[:[f.name for f in dataclasses.fields(Request)]
                                                                   .index("output_ids")])


def request_to_dict(r: Request) -> dict:
    d = {k: getattr(r, k) for k in REQUEST_FIELDS}
    d["stop"] = list(d["stop"])
    return d


def request_from_dict(d: dict) -> Request:
    unknown = set(d) - set(REQUEST_FIELDS)
    if unknown:
        raise ValueError(f"unknown request field(s) {', '.join(sorted(unknown))}")
    d = dict(d)
    d["stop"] = tuple(d.get("stop", ()))
    d["prompt_ids"] = [int(t) for t in d["prompt_ids"]]
    return Request(**d)


def engine_dict(case: Case, model: str) -> dict:
    """Every EngineConfig switch of the run under test (faults, policy and seed stand apart)."""
    from harness.engine.config import EngineConfig
    kw = dict(case.engine)
    kw.setdefault("model", model)
    cfg = EngineConfig(**{k: v for k, v in kw.items() if k != "costs"})
    d = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
         if f.name not in ("faults", "policy", "seed", "costs")}
    d["costs"] = dataclasses.asdict(cfg.costs) if not isinstance(kw.get("costs"), dict) else kw["costs"]
    return d


def reproducer(case: Case, failure: Failure, *, faults, seed, model, detect) -> dict:
    return {"format": FORMAT, "version": VERSION, "harness_version": harness_version(), "seed": seed,
            "faults": sorted(faults), "detect": detect, "engine": engine_dict(case, model), "policy": case.policy,
            "requests": [request_to_dict(r) for r in case.requests], "failure": failure.to_dict()}


class ReproError(ValueError):
    """A file that is not one of our reproducers, or one from an incompatible version."""


class ReproUnavailable(ReproError):
    """A sound reproducer this machine cannot run (its model is missing)."""


def load_reproducer(path: str) -> dict:
    """The reproducer as a dict plus 'case' (a Case) and 'faults' (a frozenset); ReproError if bad."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as e:
        raise ReproError(f"cannot read {path}: {e.strerror}") from None
    try:
        d = json.loads(text.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ReproError(f"{path} is not an overlap-harness reproducer (not JSON)") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ReproError(f"{path} is not an overlap-harness reproducer (no \"format\": \"{FORMAT}\")")
    if d.get("version") != VERSION:
        raise ReproError(f"{path} is reproducer format version {d.get('version')!r} (written by overlap-harness "
                         f"{d.get('harness_version', '?')}); this overlap-harness {harness_version()} reads "
                         f"version {VERSION}")
    from harness.repro_check import BadReproducer, Unavailable, check_reproducer
    try:  # every field as its CLI flag is checked; the engine built once; every request fits it
        engine, policy, reqs, faults, _ = check_reproducer(d, DETECT, REQUEST_FIELDS)
    except BadReproducer as e:
        raise ReproError(f"{path}: incompatible or damaged reproducer ({e})") from None
    except Unavailable as e:
        raise ReproUnavailable(f"cannot replay {path} here: {e}") from None
    return dict(d, case=Case(engine, policy, reqs), faults=faults)


# -- artifacts -----------------------------------------------------------------------------
def check_writable(out: str) -> None:
    """Raise OSError with a reason when `out` cannot be created or written."""
    os.makedirs(out, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".probe-", dir=out)
    os.close(fd)
    os.remove(probe)


def write_artifacts(out: str, case: Case, failure: Failure, *, faults, seed, model, detect) -> dict:
    """The reproducer JSON, and a Chrome trace and a PNG of the streams around the failing step."""
    os.makedirs(out, exist_ok=True)
    repro = os.path.join(out, "repro.json")
    with open(repro, "w", encoding="utf-8") as f:
        json.dump(reproducer(case, failure, faults=faults, seed=seed, model=model, detect=detect), f, indent=1)
    paths = {"repro": repro}
    try:
        paths.update(timeline(out, case, failure, faults=faults, seed=seed, model=model))
    except Exception as e:  # the reproducer matters most; say why there is no picture
        paths["timeline_error"] = f"{type(e).__name__}: {e}"
    return paths


def timeline(out: str, case: Case, failure: Failure, *, faults, seed, model) -> dict:
    from harness.device.trace import write_timeline
    ex = None
    try:
        ex = execute(case, faults=faults, seed=seed, model=model, track=failure.kind == "hazard")
    except Exception:
        pass
    if ex is None or ex.engine is None:
        raise RuntimeError("the case does not run to the end (it crashed), so there is no timeline")
    dev = ex.engine.dev
    last = max((op.step for op in dev.ops), default=0)
    step = failure.step if failure.step is not None else last
    marks = failure.ops
    if ex.hazards:
        h = ex.hazards[0]
        step, marks = h.step, tuple(x for x in (h.first.op_id, h.second.op_id) if x is not None)
    lo = step - 2
    by_id = {op.id: op for op in dev.ops}
    for m in marks:
        if m in by_id:
            lo = min(lo, by_id[m].step)
    steps = (max(0, lo), min(last, step + 2))
    short = failure.summary if len(failure.summary) <= 80 else failure.summary[:77] + "..."
    title = f"{failure.kind} at step {step}: {short}"
    return write_timeline(dev, out, steps, title, highlight=step, marks=marks)


# -- greedy shrinking (after hypothesis) -------------------------------------------------------
def _simpler_requests(r: Request):
    """Variants of one request, each a step toward the plain greedy request."""
    from harness.workloads import clone
    def v(**kw):
        c = clone([r])[0]
        for k, x in kw.items():
            setattr(c, k, x)
        return c
    if r.arrival:
        yield v(arrival=0)
    if r.abort_after is not None:
        yield v(abort_after=None)
    if r.stop:
        yield v(stop=())
    if r.temperature:
        yield v(temperature=0.0, top_p=1.0, seed=None)
    if r.repetition_penalty != 1.0:
        yield v(repetition_penalty=1.0)
    if r.max_new_tokens > 1:
        yield v(max_new_tokens=max(1, r.max_new_tokens // 2))
        yield v(max_new_tokens=r.max_new_tokens - 1)
    keep = 1  # the first token stays (the BOS, for models that have one)
    if len(r.prompt_ids) > keep + 1:
        n = len(r.prompt_ids) - keep
        yield v(prompt_ids=r.prompt_ids[:keep] + r.prompt_ids[keep + n // 2:])
        yield v(prompt_ids=r.prompt_ids[:keep] + r.prompt_ids[keep:keep + n // 2] or r.prompt_ids[:keep + 1])


def greedy_shrink(case: Case, still_fails, deadline: float) -> Case:
    """Delta debugging on what hypothesis left: drop requests, then simplify the policy, the
    engine switches and each request, keeping every step that still fails the same way."""
    def attempt(c: Case) -> bool:
        if time.monotonic() > deadline:
            raise _Stop()
        return still_fails(c)
    try:
        changed = True
        while changed:
            changed = False
            for i in range(len(case.requests)):
                if len(case.requests) > 1 and i < len(case.requests):
                    c = Case(dict(case.engine), case.policy, case.requests[:i] + case.requests[i + 1:])
                    if attempt(c):
                        case, changed = c, True
            if case.policy != "serial" and attempt(Case(dict(case.engine), "serial", case.requests)):
                case, changed = Case(dict(case.engine), "serial", case.requests), True
            for k in [k for k in case.engine if k not in ("max_running", "model", "costs")]:
                eng = {x: y for x, y in case.engine.items() if x != k}
                if attempt(Case(eng, case.policy, case.requests)):
                    case, changed = Case(eng, case.policy, case.requests), True
            for i in range(len(case.requests)):
                for r in _simpler_requests(case.requests[i]):
                    c = Case(dict(case.engine), case.policy, case.requests[:i] + [r] + case.requests[i + 1:])
                    if attempt(c):
                        case, changed = c, True
                        break
    except _Stop:
        pass
    return case


# -- the explorer ----------------------------------------------------------------------------
class _Stop(KeyboardInterrupt):
    """Ends a hypothesis search from inside the condition (hypothesis re-raises KeyboardInterrupt
    and treats every other exception as a failure to shrink)."""


@dataclass
class StressResult:
    runs: int = 0
    hazards: int = 0  # runs that reported a hazard
    divergences: int = 0  # runs whose tokens diverged
    crashes: int = 0
    violations: int = 0  # runs where the scheduler's invariant checks failed
    explore_s: float = 0.0
    shrink_s: float = 0.0
    first_found_s: float | None = None  # seconds from the start to the first failure
    first: tuple | None = None  # (Case, Failure): the first failure found
    best: tuple | None = None  # (Case, Failure): the smallest case that fails the same way
    shrink_runs: int = 0
    interrupted: bool = False

    @property
    def failed(self) -> bool:
        return self.best is not None


def burst_seeds(seed: int, shard: int = 0, of: int = 1):
    """The seeds of the search bursts of shard `shard` of `of`. The bursts of one --seed form one
    sequence; shard I of N takes every N-th burst from the I-th, so N shards (a CI matrix of N
    jobs) explore disjoint bursts, together the sequence one run would, and shard 0/1 is that run.
    A finding needs no shard to replay: its reproducer holds the case and the engine seed."""
    rnd = random.Random(seed)
    k = 0
    while True:
        s = rnd.getrandbits(64)
        if k % of == shard:
            yield s
        k += 1


def parse_shard(text: str) -> tuple[int, int]:
    """--shard I/N (0 <= I < N) -> (I, N); ValueError with the reason otherwise."""
    i, sep, n = text.partition("/")
    try:
        shard, of = int(i), int(n)
    except ValueError:
        shard = of = -1
    if not sep or of < 1 or not 0 <= shard < of:
        raise ValueError(f"bad --shard {text!r}: expected I/N with 0 <= I < N, e.g. 0/4")
    return shard, of


class Stress:
    def __init__(self, *, seconds: float, seed: int = 0, faults=frozenset(), detect: str = "all",
                 kinds=POLICY_KINDS, shrink: bool = True, shrink_seconds: float = 60.0, max_requests: int = 6,
                 max_running: int = 4, model: str = "tiny", spec: bool | None = None, progress=None,
                 shard: tuple[int, int] = (0, 1)):
        self.seconds, self.seed, self.faults, self.detect = seconds, seed, frozenset(faults), detect
        self.shard = shard  # (I, N): this run explores every N-th search burst from the I-th
        self.kinds, self.shrink, self.shrink_seconds = tuple(kinds), shrink, shrink_seconds
        self.max_requests, self.max_running, self.model = max_requests, max_running, model
        self.spec = spec  # None: explore plain and speculative decoding; False / True: only one
        self.progress = progress
        self.res = StressResult()
        self._phase = "explore"
        self._t0 = self._deadline = self._shrink_end = 0.0

    def _condition(self, case: Case) -> bool:
        from hypothesis import reject
        now = time.monotonic()
        if now > self._deadline:
            raise _Stop()
        try:
            f, _ = check(case, faults=self.faults, seed=self.seed, model=self.model, detect=self.detect)
        except DoesNotFit:
            reject()
        r = self.res
        r.runs += 1
        if self._phase == "shrink":
            r.shrink_runs += 1
        if f is not None:
            r.hazards += f.kind == "hazard"
            r.divergences += f.kind == "divergence"
            r.crashes += f.kind == "crash"
            r.violations += f.kind == "violation"
        self._show()
        if f is None:
            return False
        if r.first is None:
            r.first_found_s = time.monotonic() - self._t0
            r.first = r.best = (case, f)
            if not self.shrink:
                raise _Stop()
            self._phase = "shrink"
            r.explore_s = time.monotonic() - self._t0
            self._shrink_end = time.monotonic() + self.shrink_seconds
            self._deadline = time.monotonic() + self.shrink_seconds * 2 / 3  # the rest: greedy_shrink
            return True
        if f.signature == r.first[1].signature:
            r.best = (case, f)
            return True
        return False

    def _same_failure(self, case: Case) -> bool:
        try:
            f, _ = check(case, faults=self.faults, seed=self.seed, model=self.model, detect=self.detect)
        except DoesNotFit:
            return False
        self.res.runs += 1
        self.res.shrink_runs += 1
        self._show()
        if f is not None and f.signature == self.res.first[1].signature:
            self.res.best = (case, f)
            return True
        return False

    def _show(self, final: bool = False) -> None:
        if self.progress is not None:
            self.progress(self, final)

    def status_line(self) -> str:
        r = self.res
        el = time.monotonic() - self._t0
        rate = r.runs / el if el > 0 else 0.0
        shard = f" shard {self.shard[0]}/{self.shard[1]}" if self.shard[1] > 1 else ""
        line = (f"stress seed {self.seed}{shard}: {r.runs} schedules, {rate:.1f}/s, hazards {r.hazards}, "
                f"divergences {r.divergences}" + (f", violations {r.violations}" if r.violations else "")
                + (f", crashes {r.crashes}" if r.crashes else ""))
        if self._phase == "shrink" and r.best is not None:
            line += f" | shrinking ({len(r.best[0].requests)} requests, {r.shrink_runs} tries)"
        else:
            line += f" | {min(el, self.seconds):.0f}/{self.seconds:.0f} s"
        return line

    def run(self) -> StressResult:
        from hypothesis import HealthCheck, Phase, find, settings
        from hypothesis.errors import NoSuchExample, Unsatisfiable
        from harness.engine.build import build_engine, load_model
        from harness.engine.config import EngineConfig
        tok = load_model(self.model)[2]
        build_engine(EngineConfig(model=self.model))  # warm up before the clock starts
        strategy = cases(tok, self.kinds, self.max_requests, self.max_running, self.spec, self.model)
        # Short searches from fresh seeds: within one long search hypothesis keeps mutating the
        # examples it has, which explores far less than independent draws (measured: 3x fewer
        # distinct drafters and policies in the first 30 s).
        opts = settings(database=None, max_examples=BURST, deadline=None, phases=[Phase.generate, Phase.shrink],
                        suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
        seeds = burst_seeds(self.seed, *self.shard)
        self._t0 = time.monotonic()
        self._deadline = self._t0 + self.seconds
        try:
            while self.res.first is None and time.monotonic() < self._deadline:
                try:
                    find(strategy, self._condition, settings=opts, random=random.Random(next(seeds)))
                except (NoSuchExample, Unsatisfiable):
                    continue  # nothing in this burst: the next one
        except _Stop:
            pass
        except KeyboardInterrupt:
            self.res.interrupted = True
        if self.res.first is not None and self.shrink and not self.res.interrupted:
            try:
                greedy_shrink(self.res.best[0], self._same_failure, self._shrink_end)  # updates res.best
            except KeyboardInterrupt:
                self.res.interrupted = True
        now = time.monotonic()
        if self.res.first is None:
            self.res.explore_s = now - self._t0
        else:
            self.res.shrink_s = now - self._t0 - self.res.explore_s
        self._show(final=True)
        return self.res


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While inside, SIGTERM ends the search as Ctrl-C does (KeyboardInterrupt, which the search
    turns into 'interrupted, keep what was found'); yields a list that is non-empty once it came."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield got
        return

    def handler(signum, frame):
        if not got:
            got.append(signum)
            raise KeyboardInterrupt
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def sigterm_deferred():
    """While inside (writing what was found), SIGTERM is noted, not obeyed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _progress_printer(stream=sys.stderr):
    tty = hasattr(stream, "isatty") and stream.isatty()
    last = [0.0]

    def show(s: Stress, final: bool) -> None:
        now = time.monotonic()
        if not final and now - last[0] < (0.2 if tty else 5.0):
            return
        last[0] = now
        line = s.status_line()
        if tty:
            stream.write("\r\033[K" + line + ("\n" if final else ""))
        else:
            stream.write(line + "\n")
        stream.flush()
    return show


# -- the commands ------------------------------------------------------------------------------
class BadInput(Exception):
    """A one-line error, exit code 2 (kept here: under `python -m harness.cli` the module
    harness.cli is loaded twice, so its UsageError class would not be the one main() catches)."""


def _usage(msg: str):
    return BadInput(msg)


def _one_line_errors(fn):
    def wrapped(a) -> int:
        try:
            return fn(a)
        except BadInput as e:
            print(f"overlap-harness: error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
    wrapped.__name__ = fn.__name__
    return wrapped


def cmd_stress(a) -> int:
    from harness.engine.build import ModelUnavailable, load_model
    from harness.faults import CATALOGUE, check_names
    check_names(a.fault, BadInput)
    if not 0 < a.minutes < float("inf"):
        raise _usage(f"--minutes must be a positive number, got {a.minutes:g}")
    if not 0 <= a.shrink_seconds < float("inf"):
        raise _usage(f"--shrink-seconds must be a number >= 0, got {a.shrink_seconds:g}")
    kinds = tuple(k.strip() for k in a.policies.split(",") if k.strip())
    bad = [k for k in kinds if k not in POLICY_KINDS]
    if bad or not kinds:
        raise _usage(f"bad --policies {a.policies!r}: expected a comma list of {', '.join(POLICY_KINDS)}")
    for name, v, hi in (("--max-requests", a.max_requests, 64), ("--max-running", a.max_running, 256)):
        if not 1 <= v <= hi:  # a workload hypothesis can draw and shrink in seconds
            raise _usage(f"{name} must be between 1 and {hi}, got {v}")
    try:
        check_writable(a.out)
    except OSError as e:
        raise _usage(f"cannot write --out {a.out}: {e.strerror or e}") from None
    try:
        load_model(a.model)
    except ModelUnavailable as e:
        raise _usage(str(e)) from None
    if a.spec == "on":
        from harness.strategies import drafters
        if not drafters(a.model):
            raise _usage("--spec on: this engine has no speculative decoding")
    try:
        shard = parse_shard(a.shard)
    except ValueError as e:
        raise _usage(str(e)) from None
    faults = frozenset(a.fault)
    ordering = [f for f in faults if not CATALOGUE[f].ordering]
    print(f"overlap-harness stress: seed {a.seed}" + (f", shard {a.shard}" if shard[1] > 1 else "")
          + f", {a.minutes:g} min, faults "
          f"{', '.join(sorted(faults)) or 'none'}, policies {','.join(kinds)}, detect {a.detect}, out {a.out}"
          + (f" (not ordering faults: {', '.join(ordering)}; only their tokens can show them)" if ordering else ""),
          file=sys.stderr)
    s = Stress(seconds=a.minutes * 60, seed=a.seed, faults=faults, detect=a.detect, kinds=kinds,
               shrink=a.shrink, shrink_seconds=a.shrink_seconds, max_requests=a.max_requests,
               max_running=a.max_running, model=a.model, spec={"both": None, "off": False, "on": True}[a.spec],
               progress=_progress_printer(), shard=shard)
    with sigterm_as_interrupt() as term:  # CI cancellations and `timeout` send SIGTERM: keep what was found
        try:
            res = s.run()
        except KeyboardInterrupt:  # came after the search's own handling (while it wrapped up)
            s.res.interrupted = True
            res = s.res
        with sigterm_deferred():  # from here on a SIGTERM must not cost what was found
            return _report(a, res, term, faults)


def _report(a, res, term, faults) -> int:
    code = EXIT_TERMINATED if term else EXIT_INTERRUPTED
    r = res
    print(f"{r.runs} schedules in {r.explore_s + r.shrink_s:.1f} s ({r.runs / max(r.explore_s + r.shrink_s, 1e-9):.1f}/s)"
          f"; hazards {r.hazards}, divergences {r.divergences}, violations {r.violations}, crashes {r.crashes}",
          file=sys.stderr)
    if not res.failed:
        print(f"{'terminated' if term else 'interrupted'}: nothing found so far" if res.interrupted else
              f"PASS: no hazard, divergence or crash in {r.runs} schedules", file=sys.stdout)
        return code if res.interrupted else 0
    case, failure = res.best
    paths = write_artifacts(a.out, case, failure, faults=faults, seed=a.seed, model=a.model, detect=a.detect)
    first_case = res.first[0]
    print(f"FAIL: {failure.kind}: {failure.summary}")
    print(f"found after {r.first_found_s:.1f} s with {len(first_case.requests)} requests; shrunk to "
          f"{len(case.requests)} request(s), policy {case.policy}, engine {case.engine} in {r.shrink_runs} tries"
          + (" (shrinking interrupted)" if res.interrupted else ""))
    print(failure.detail)
    print(f"reproducer: {paths['repro']}")
    if "png" in paths:
        print(f"timeline:   {paths['png']} (PNG), {paths['trace']} (Chrome trace: open in Perfetto)")
    else:
        print(f"timeline:   none ({paths.get('timeline_error')})")
    print(f"replay:     overlap-harness replay {paths['repro']}")
    return code if res.interrupted else EXIT_FOUND


def replay(d: dict) -> Failure | None:
    f, _ = check(d["case"], faults=d["faults"], seed=d.get("seed", 0), model=d["case"].engine.get("model", "tiny"),
                 detect=d.get("detect", "all"))
    return f


def cmd_replay(a) -> int:
    try:
        d = load_reproducer(a.file)
    except ReproUnavailable as e:
        raise _usage(str(e)) from None
    except ReproError as e:  # exit 2; a reproducer that runs and fails, or crashes the engine, is exit 1
        raise _usage(f"bad reproducer: {e}") from None
    if a.timeline:
        try:
            check_writable(a.timeline)
        except OSError as e:
            raise _usage(f"cannot write --timeline {a.timeline}: {e.strerror or e}") from None
    case = d["case"]
    rec = d.get("failure") or {}
    print(f"replaying {a.file}: {len(case.requests)} request(s), policy {case.policy}, faults "
          f"{', '.join(sorted(d['faults'])) or 'none'}, seed {d.get('seed', 0)}", file=sys.stderr)
    try:
        f = replay(d)
    except DoesNotFit as e:
        raise _usage(f"bad reproducer: {a.file}: incompatible reproducer ({e})") from None
    if a.timeline and f is not None:
        paths = timeline(a.timeline, case, f, faults=d["faults"], seed=d.get("seed", 0),
                         model=case.engine.get("model", "tiny"))
        print(f"timeline: {paths['png']}, {paths['trace']}", file=sys.stderr)
    if f is None:
        print(f"no longer fails (recorded: {rec.get('kind', '?')}: {rec.get('summary', '?')})")
        return 0
    same = list(f.signature) == list(rec.get("signature", [])) and f.summary == rec.get("summary")
    print(f"still fails{'' if same else ' (differently from the recorded failure)'}: {f.kind}: {f.summary}")
    print(f.detail)
    return EXIT_FOUND


def add_commands(sub) -> None:
    from harness.engine.build import MODELS
    s = sub.add_parser("stress", help="explore workloads x schedule policies; shrink and save the first failure")
    s.add_argument("--minutes", type=float, default=1.0, help="time to explore (default 1)")
    s.add_argument("--seed", type=int, default=0, help="drives the search and the engine (default 0)")
    s.add_argument("--shard", default="0/1", metavar="I/N",
                   help="explore shard I of N: a disjoint slice of the seed's search bursts, so N jobs "
                        "(a CI matrix) cover N times the schedules (default 0/1: all of them)")
    s.add_argument("--fault", action="append", default=[], metavar="NAME", help="inject a fault (repeatable)")
    s.add_argument("--out", default="stress-out", metavar="DIR",
                   help="where a failure's reproducer, trace and PNG go (default stress-out)")
    s.add_argument("--model", default="tiny", choices=MODELS, help="weights to serve (default tiny)")
    s.add_argument("--policies", default=",".join(POLICY_KINDS),
                   help=f"schedule policies to explore, comma list (default {','.join(POLICY_KINDS)})")
    s.add_argument("--detect", default="all", choices=DETECT,
                   help="failures that count: hazards, token divergences, or all (default)")
    s.add_argument("--shrink", action=argparse.BooleanOptionalAction, default=True,
                   help="shrink the first failure to a minimal case (default on)")
    s.add_argument("--shrink-seconds", type=float, default=60.0, help="time limit for shrinking (default 60)")
    s.add_argument("--max-requests", type=int, default=6, help="requests per explored workload (default 6)")
    s.add_argument("--max-running", type=int, default=4, help="largest max_running explored (default 4)")
    s.add_argument("--spec", default="both", choices=("both", "off", "on"),
                   help="explore plain decoding, speculative decoding, or both (default)")
    s.set_defaults(fn=_one_line_errors(cmd_stress))
    r = sub.add_parser("replay", help="run a stress reproducer again and say whether it still fails")
    r.add_argument("file", help="a repro.json written by `overlap-harness stress`")
    r.add_argument("--timeline", metavar="DIR", help="also write the trace and PNG of the replay into DIR")
    r.set_defaults(fn=_one_line_errors(cmd_replay))
