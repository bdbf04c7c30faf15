"""The search loop: hypothesis draws cases in short bursts from fresh seeds until the time
is spent, then shrinks the first failure; shards split the bursts of one seed between jobs."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

from harness import stopping
from harness.search.case import DoesNotFit, check
from harness.search.shrink import StopSearch, greedy_shrink
from harness.workloads.strategies import POLICY_KINDS, Case, cases

BURST = 10  # examples per hypothesis search before a fresh seed


def stop_if_asked() -> None:
    """A SIGTERM already noted ends the search at its next schedule. The handler raises
    KeyboardInterrupt once, where the main thread happens to be; inside a callback Python cannot
    raise from (hypothesis's gc callback, measured: "Exception ignored in ... gc_callback") it
    was swallowed, and the search ran out its minutes and exited 0."""
    if stopping.requested():
        raise KeyboardInterrupt


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
                 shard: tuple[int, int] = (0, 1), schedules: int | None = None):
        self.seconds, self.seed, self.faults, self.detect = seconds, seed, frozenset(faults), detect
        # a fixed sample instead of a time budget: the same schedules on any machine, however loaded
        self.schedules = schedules
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
        stop_if_asked()
        now = time.monotonic()
        if now > self._deadline or (self._phase == "explore" and self.schedules is not None
                                    and self.res.runs >= self.schedules):
            raise StopSearch()
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
                raise StopSearch()
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
        stop_if_asked()
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

    @property
    def phase(self) -> str:
        """"explore" (searching), then "shrink" once a failure was found."""
        return self._phase

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
        except StopSearch:
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
