"""The search against a served pair (vLLM, or any OpenAI-compatible on/off pair): hypothesis draws
submissions (harness.search.served.case) in bursts from the seeds of `--seed` and `--shard`
(harness.search.explore.burst_seeds), each is judged on both warm servers (served_judge), a new
failure is shrunk within its time limit and written as a reproducer, known-upstream findings are
counted once per entry, and the search goes on until its time is spent."""
from __future__ import annotations

import os
import random
import re
import time
from dataclasses import dataclass, field

from harness.search.explore import burst_seeds, stop_if_asked
from harness.search.served.case import ServedCase, case_features, features
from harness.search.served.chat import submissions
from harness.search.served.judge import judge
from harness.search.served.shrink import shrink

# async timing decides some failures (a reorder needs a request to land between two steps): a
# smaller case may fail more rarely than the one found, or have failed its one shrinking try by luck
# (measured: input_ids_fast_path_after_reorder's and penalty_ids_wrong_row's shrunk cases of
# 2026-12-03 did not replay). So the reproducer, loaded back as `replay` runs it, is judged
# REPLAY_TRIES times; below RELIABLE of them, the larger cases kept before it are judged too (newest
# first, at most FALLBACKS, then the case as found), and the one that replays most often is written;
# candidates after the first stop once half the shrinking time (at least a minute) is spent on them.
REPLAY_TRIES = 3
RELIABLE = 2
FALLBACKS = 3
BURST = 50  # draws per hypothesis search before a fresh seed (its first draw is the simplest case)


@dataclass
class Found:
    finding: object  # served_judge.Finding, the first one of the case
    found_s: float  # seconds from the search's start
    first: ServedCase
    best: ServedCase
    tries: int = 0
    shrink_s: float = 0.0
    repro: str = ""
    replay_same: bool | None = None  # the reproducer, loaded back, failed the same way in a replay
    replays: int = 0  # of REPLAY_TRIES replays, those that failed the same way
    flaky: bool = False  # the case as found missed once when judged again: two runs per shrinking try


@dataclass
class ServedStressResult:
    runs: int = 0
    shrink_runs: int = 0  # of the runs, those spent shrinking (and replaying) a finding
    cases: int = 0
    refused: int = 0
    refusals: list = field(default_factory=list)  # the servers' answers to the first refused cases (distinct)
    server_errors: int = 0  # answers the server failed (either arm)
    server_error_whats: list = field(default_factory=list)  # the first distinct ones, with arm and request
    explore_s: float = 0.0
    shrink_s: float = 0.0
    found: list = field(default_factory=list)  # Found, one per new signature
    duplicates: int = 0  # runs that failed the way an earlier finding did
    known: dict = field(default_factory=dict)  # known id -> [runs, first what]
    claims: dict = field(default_factory=dict)  # claims tested without their trigger (served claims.TALLY), summed
    features: dict = field(default_factory=dict)  # feature -> cases that drew it
    rows: dict = field(default_factory=dict)  # path row -> [runs counted on, runs counted off, count on, count off]
    feature_overlap: dict = field(default_factory=dict)  # feature -> {"all"/"prefill": Share}, summed over cases
    overlap_total: dict = field(default_factory=dict)  # "all"/"prefill" -> every request's Share, summed
    interrupted: bool = False
    error: str = ""
    # per server configuration (harness.targets.vllm.configs): cases, runs, search seconds, start
    # seconds, segments; and the configurations whose servers would not start, with the line why
    configs: dict = field(default_factory=dict)
    config_errors: dict = field(default_factory=dict)
    start_s: float = 0.0  # seconds spent starting the servers of the configurations drawn
    # conversations and turns judged / left out (harness.oracles.turns); requests with client ids
    # (harness.oracles.request_ids.counts): what the request-surface draws had to judge
    turns: dict = field(default_factory=dict)
    ids: dict = field(default_factory=dict)
    effects: dict = field(default_factory=dict)  # param -> [requests it changed, requests judged] (served_effects)

    @property
    def cases_per_min(self) -> float:
        return 60 * self.cases / self.explore_s if self.explore_s > 0 else 0.0


class ServedStress:
    def __init__(self, target, tok, *, seconds: float, seed: int = 0, shard=(0, 1), cases: int = 4,
                 shrink_seconds: float = 180.0, out: str = "stress-out", version: str | None = None,
                 agent: bool = True, vllm: bool = True, max_findings: int = 0, patches=(), progress=None,
                 max_runs: int = 0, configs=None, switch=None, segment_seconds: float = 120.0):
        self.t, self.tok, self.seconds, self.seed, self.shard = target, tok, seconds, seed, shard
        self.cases, self.shrink_seconds, self.out, self.version = cases, shrink_seconds, out, version
        self.agent, self.vllm, self.max_findings, self.patches = agent, vllm, max_findings, tuple(patches)
        self.progress = progress
        self.max_runs = max_runs  # > 0: stop after this many submissions (tests: a count, not a time)
        self.res = ServedStressResult()
        self.current = ""
        self._t0 = 0.0
        self._stop = False
        self._seen: set = set()
        # the server configurations drawn, one per segment of runs (a pair takes about a minute to
        # start here: never one per case): `configs` in the order to visit (None: the target's own
        # only), `switch(name)` stops the pair and returns the target in that configuration
        self.configs, self.switch, self.segment_seconds = list(configs or []), switch, segment_seconds
        self.config = getattr(getattr(target, "config", None), "name", None)
        self._seg_end = float("inf")

    # -- one submission ------------------------------------------------------------------
    def judge(self, case: ServedCase):
        return judge(self.t, case, self.version, self.agent)

    def _count(self, case: ServedCase, v) -> None:
        r = self.res
        r.runs += 1
        if v.refused:  # a case the generator should not have drawn: said in the summary, to fix there
            r.refused += 1
            if v.refused not in r.refusals and len(r.refusals) < 3:
                r.refusals.append(v.refused)
            return
        r.cases += case.cases
        r.server_errors += len(v.server_errors)
        for lab, rid, what in v.server_errors:
            if len(r.server_error_whats) < 3 and all(what != w for _, _, w in r.server_error_whats):
                r.server_error_whats.append((lab, rid, what))
        if self.config is not None:
            c = r.configs.setdefault(self.config, {"cases": 0, "runs": 0, "search_s": 0.0, "start_s": 0.0, "segments": 0})
            c["cases"] += case.cases
            c["runs"] += 1
        mixes: dict = {}
        for q in case.requests:
            mixes.setdefault(q.rid.split("r")[0], set()).update(features(q))
        for feats in mixes.values():
            for f in feats | set(case_features(ServedCase([], case.delays, case.controls))):
                r.features[f] = r.features.get(f, 0) + 1
        from harness.targets.vllm import paths as vp
        for row in vp.PATHS if self.agent else ():  # no agent: nothing counted the paths
            if row.pair != "main" or row.cpu_reason:
                continue
            on, off = vp.row_count(row, v.counts_on), vp.row_count(row, v.counts_off)
            acc = r.rows.setdefault(row.name, [0, 0, 0, 0])
            acc[0] += on > 0
            acc[1] += off > 0
            acc[2] += on
            acc[3] += off
        for kid, what in v.known:
            k = r.known.setdefault(kid, [0, what])
            k[0] += 1
        for k, n in (getattr(v, "claims", None) or {}).items():
            r.claims[k] = r.claims.get(k, 0) + n
        r.ids["server_aborted"] = r.ids.get("server_aborted", 0) + getattr(v, "server_aborted", 0)
        for (_, p), changed in (getattr(v, "effects", None) or {}).items():
            acc = r.effects.setdefault(p, [0, 0])
            acc[0] += bool(changed)
            acc[1] += 1
        from harness.oracles import request_ids
        for k, n in list((getattr(v, "turns", None) or {}).items()) + list(request_ids.counts(case.requests).items()):
            acc = r.turns if k in ("conversations", "turns", "left_out") else r.ids if k != "cut" else None
            if acc is not None:
                acc[k] = acc.get(k, 0) + n
        for ph, sh in getattr(v, "overlap_total", {}).items():
            r.overlap_total[ph] = r.overlap_total[ph].add(sh) if ph in r.overlap_total else sh
        for f, shares in getattr(v, "feature_overlap", {}).items():
            acc = r.feature_overlap.setdefault(f, {})
            for ph, sh in shares.items():
                acc[ph] = acc[ph].add(sh) if ph in acc else sh

    def _condition(self, case: ServedCase) -> bool:
        from harness.search.shrink import StopSearch
        stop_if_asked()  # a SIGTERM whose one KeyboardInterrupt was swallowed (harness/search/explore.py)
        if self._stop or time.monotonic() > self._t0 + self.seconds or (
                self.max_runs and self.res.runs - self.res.shrink_runs >= self.max_runs):
            raise StopSearch()
        if time.monotonic() > self._seg_end:
            raise _SegmentEnd()
        key = _key(case)
        if key in self._seen:  # hypothesis draws the same example again now and then: no run for it
            return False
        self._seen.add(key)
        self.current = case.shape()
        self._show()
        v = self.judge(case)
        self._count(case, v)
        self._show()
        if not v.failed:
            return False
        sig = v.signature()
        if any(tuple(f.finding.signature) == tuple(sig) for f in self.res.found):
            self.res.duplicates += 1
            return False
        self._new_finding(case, v)
        if self.max_findings and len(self.res.found) >= self.max_findings:
            self._stop = True
            raise StopSearch()
        return False

    def _new_finding(self, case: ServedCase, v) -> None:
        from harness.search.served import repro as served_repro
        r = self.res
        f = Found(v.new[0], time.monotonic() - self._t0, case, case)
        r.found.append(f)
        t = time.monotonic()
        sig = tuple(v.signature())
        self.current = f"shrinking {case.shape()}"
        self._show()

        def judged(c: ServedCase):
            w = self.judge(c)
            r.runs += 1
            r.shrink_runs += 1
            self.current = f"shrinking ({len(c.requests)} request(s)): {c.shape()}"
            self._show()
            return next((x for x in w.new if tuple(x.signature) == sig), None)

        def still_fails(c: ServedCase) -> bool:
            same = judged(c)
            if same is not None:
                f.finding = same  # the verdict of the smallest case so far: what its reproducer records
            return same is not None
        history = [case]
        if self.shrink_seconds > 0:
            # the case as found, once more: a failure that misses here (timing-dependent: measured,
            # prefill_chunk_sample_fed_back failed 1 run in 3) gets two runs per shrinking try, or
            # nearly every smaller case is dropped for a miss (21 tries left its 7 requests at 7)
            deadline = time.monotonic() + self.shrink_seconds
            f.flaky = not still_fails(case)
            named = dict.fromkeys(re.findall(r"\b(c\d+r\d+)", f.finding.summary))  # our rids, in order
            f.best, f.tries = shrink(case, still_fails, deadline, history, runs=2 if f.flaky else 1,
                                     focus=list(named))
        f.shrink_s = time.monotonic() - t
        r.shrink_s += f.shrink_s
        f.repro = os.path.join(self.out, f"repro-{len(r.found)}-{f.finding.kind}.json")
        found = {"after_s": round(f.found_s, 1), "requests_found": len(case.requests),
                 "requests_shrunk": len(f.best.requests), "shrink_tries": f.tries,
                 "missed_once": f.flaky}

        def write(c: ServedCase, finding, **more) -> None:
            served_repro.write(f.repro, served_repro.reproducer(
                self.t, c, finding, seed=self.seed, patches=self.patches, version=self.version,
                found=dict(found, requests_shrunk=len(c.requests), **more)))
        write(f.best, f.finding)
        if self.shrink_seconds > 0:  # the reproducer as `replay` runs it: how often the same verdict?
            t = time.monotonic()
            cands = [f.best] + [c for c in history[::-1] if _key(c) != _key(f.best)][:FALLBACKS]
            cands += [case] if all(_key(c) != _key(case) for c in cands) else []
            best, until = None, t + max(60.0, self.shrink_seconds / 2)  # a crash restarts a server per run
            for cand in cands:
                if best is not None and time.monotonic() > until:
                    break
                write(cand, f.finding)
                _, back = served_repro.load(f.repro)
                got = [judged(back) for _ in range(REPLAY_TRIES)]
                k = sum(g is not None for g in got)
                if best is None or k > best[0]:
                    best = (k, cand, next((g for g in got if g is not None), f.finding))
                if k >= RELIABLE:
                    break
            f.replays, f.best, f.finding = best
            f.replay_same = f.replays > 0
            write(f.best, f.finding, replayed_same=f.replay_same, replays=f"{f.replays} of {REPLAY_TRIES}")
            f.shrink_s += time.monotonic() - t
            r.shrink_s += time.monotonic() - t

    def _use(self, name: str) -> bool:
        """The servers of configuration `name` (the pair of the last one stopped first: one pair alive
        at a time); False, with the line why kept, when they do not start: the search goes on in
        the other configurations."""
        if name == self.config or self.switch is None or name in self.res.config_errors:
            return name not in self.res.config_errors
        from harness.targets.base import TargetError, TargetUnavailable
        self.current = f"starting the servers of configuration {name}"
        self._show()
        t = time.monotonic()
        try:
            self.t = self.switch(name)
            for o in (False, True):
                self.t.url(o)
            ok = True
        except (TargetUnavailable, TargetError, ValueError) as e:
            self.res.config_errors[name] = (str(e).strip().splitlines() or ["?"])[0][:300]
            ok = False
        dt = time.monotonic() - t
        self.res.start_s += dt
        self.config = name
        if ok:
            self.res.configs.setdefault(name, {"cases": 0, "runs": 0, "search_s": 0.0, "start_s": 0.0,
                                               "segments": 0})["start_s"] += dt
        return ok

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> ServedStressResult:
        from hypothesis import HealthCheck, Phase, find, settings
        from hypothesis.errors import NoSuchExample, Unsatisfiable
        from harness.search.shrink import StopSearch
        opts = settings(database=None, max_examples=BURST, deadline=None, phases=[Phase.generate],
                        suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
        seeds = burst_seeds(self.seed, *self.shard)
        for o in (False, True):  # both servers up before the clock starts
            self.t.url(o)
        self._t0 = time.monotonic()
        order = iter(self.configs or [self.config])
        first = True
        try:
            while not self._stop and time.monotonic() < self._t0 + self.seconds:
                name = next(order, None)
                if name is None:  # every configuration visited: round again, same order
                    order = iter(self.configs or [self.config])
                    name = next(order)
                if not first and not self._use(name):
                    if len(r_errs := self.res.config_errors) >= len(set(self.configs)):
                        self.res.error = f"no configuration's servers start: {next(iter(r_errs.values()))}"
                        break
                    continue
                first = False
                seg_t0, seg_shrink = time.monotonic(), self.res.shrink_s
                self._seg_end = seg_t0 + self.segment_seconds if len(set(self.configs)) > 1 else float("inf")
                pri = bool(getattr(getattr(self.t, "config", None), "priority", False))
                strategy = submissions(self.tok, self.cases, vllm=self.vllm, agent=self.agent, priority=pri)
                try:
                    while not self._stop and time.monotonic() < min(self._seg_end, self._t0 + self.seconds):
                        try:
                            find(strategy, self._condition, settings=opts, random=random.Random(next(seeds)))
                        except (NoSuchExample, Unsatisfiable):
                            continue
                except _SegmentEnd:
                    pass
                finally:
                    if self.config is not None:
                        c = self.res.configs.setdefault(self.config, {"cases": 0, "runs": 0, "search_s": 0.0,
                                                                      "start_s": 0.0, "segments": 0})
                        c["segments"] += 1
                        c["search_s"] += time.monotonic() - seg_t0 - (self.res.shrink_s - seg_shrink)
        except StopSearch:
            pass
        except KeyboardInterrupt:
            self.res.interrupted = True
        except Exception as e:  # the target broke beyond a finding (a server that cannot start again)
            self.res.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
        self.res.explore_s = time.monotonic() - self._t0 - self.res.shrink_s - self.res.start_s
        self.current = "done"
        self._show(final=True)
        return self.res

    def _show(self, final: bool = False) -> None:
        if self.progress is not None:
            self.progress(self, final)

    def status_line(self) -> str:
        r = self.res
        el = max(time.monotonic() - self._t0, 1e-9)
        shard = f" shard {self.shard[0]}/{self.shard[1]}" if self.shard[1] > 1 else ""
        rate = 60 * r.cases / max(el - r.shrink_s - r.start_s, 1e-9)  # a pair's start is not search
        cfg = f" [configuration {self.config}]" if self.config is not None and len(set(self.configs)) > 1 else ""
        return (f"stress {self.t.name} seed {self.seed}{shard}{cfg}: {r.cases} cases in {r.runs - r.shrink_runs} runs, "
                f"{rate:.1f} cases/min, "
                f"findings {len(r.found)} new, {len(r.known)} known upstream | {min(el, self.seconds):.0f}/"
                f"{self.seconds:.0f} s | {self.current}")


class _SegmentEnd(Exception):
    """The segment of runs of one server configuration is over: the next one is drawn."""


def _key(case: ServedCase) -> str:
    return repr([(vars(r).get("rid"), r.prompt_ids, r.max_new_tokens, r.temperature, r.top_p, r.seed, r.stop,
                  r.repetition_penalty, r.ignore_eos, r.arrival, r.abort_after, getattr(r, "n", 1),
                  getattr(r, "priority", 0),
                  sorted((getattr(r, "extra", None) or {}).items(), key=str)) for r in case.requests]
                + [sorted(case.delays.items(), key=str), case.controls])


def summary_lines(s: ServedStress) -> list[str]:
    """The closing summary: cases and rate, each feature and path row, known upstream, findings."""
    from harness.targets.vllm import paths as vp
    r = s.res
    out = [f"{r.cases} cases in {r.runs - r.shrink_runs} runs ({r.refused} refused) over {r.explore_s / 60:.1f} min "
           f"of search: {r.cases_per_min:.1f} cases/min" + (f"; shrinking {r.shrink_runs} runs in {r.shrink_s:.0f} s"
                                                              if r.shrink_runs else "")]
    out += [f"refused (not judged): {why[:300]}" for why in r.refusals]
    if r.server_errors:
        out.append(f"server errors (their answers judged up to the error, no further): {r.server_errors}; "
                   + "; ".join(f"request {rid} async {lab}: {what[:200]}" for lab, rid, what in r.server_error_whats))
    out.append("features (cases that drew each): " + ", ".join(f"{k} {v}" for k, v in sorted(r.features.items())))
    out += config_lines(r)
    if s.agent:
        out.append("path rows (runs where the agent counted the path async on/off; counts on/off):")
        for name, (ron, roff, con, coff) in r.rows.items():
            row = vp.PATHS_BY_NAME[name]
            both = row.arm == "both"
            mark = "" if ron and (roff or not both) else "   <- not exercised"
            out.append(f"  {name:<36} runs {ron}/{roff if both else '-'}  counts {con}/{coff}{mark}")
    out += surface_lines(r)
    out += overlap_lines(r)
    for kid, (n, what) in sorted(r.known.items()):
        out.append(f"KNOWN UPSTREAM {kid}: in {n} run(s), first: {what[:200]}")
    from harness.search.served import claims as served_claims
    out += [x for x in (served_claims.line(r.claims),) if x]
    for i, f in enumerate(r.found, 1):
        out.append(f"FINDING {i}: {f.finding.kind}: {f.finding.summary[:300]}")
        out.append(f"  found after {f.found_s:.0f} s in a run of {f.first.cases} case(s), {len(f.first.requests)} "
                   f"request(s); shrunk to {len(f.best.requests)} request(s) in {f.tries} tries ({f.shrink_s:.0f} s"
                   + (", missed once when judged again: 2 runs a try" if f.flaky else "") + ")"
                   + ("" if f.replay_same is None else
                      f"; replayed: {f'same verdict in {f.replays} of {REPLAY_TRIES}' if f.replay_same else f'did NOT fail the same way in {REPLAY_TRIES} tries'}"))
        out.append(f"  reproducer: {f.repro}   replay: overlap-harness replay {f.repro} --target {s.t.name}")
    if r.duplicates:
        out.append(f"{r.duplicates} more run(s) failed as an earlier finding did")
    if r.error:
        out.append(f"stopped: {r.error}")
    return out


def surface_lines(r) -> list[str]:
    """What the conversations and the client ids gave the oracles to judge (harness.search.served.chat)."""
    from harness.oracles import turns
    out = [turns.line(r.turns)] if r.turns.get("conversations") else []
    if any(r.ids.get(k) for k in ("body", "header", "duplicate_groups")):
        out.append(f"request ids: {r.ids.get('body', 0)} in the body, {r.ids.get('header', 0)} as X-Request-Id; "
                   f"{r.ids.get('duplicate_groups', 0)} duplicate-id pair(s) sent together, "
                   f"{r.ids.get('duplicate_aborts', 0)} with one client disconnecting")
    from harness.search.served import effects as served_effects
    out += served_effects.line(r.effects)
    if r.ids.get("server_aborted"):
        out.append(f"pause_abort: {r.ids['server_aborted']} answer(s) cut by /pause?mode=abort, judged as prefixes")
    return out


def config_lines(r) -> list[str]:
    """Cases per server configuration (harness.targets.vllm.configs), and those that did not start."""
    out = []
    if r.configs:
        out.append(f"server configurations (cases, runs, search min, cases/min, pair start s): "
                   + "; ".join(f"{n} {c['cases']} cases, {c['runs']} runs, {c['search_s'] / 60:.1f} min, "
                               f"{60 * c['cases'] / c['search_s'] if c['search_s'] > 0 else 0:.1f}/min, "
                               f"{c['start_s']:.0f} s" for n, c in r.configs.items())
                   + (f" (starting them: {r.start_s:.0f} s, not counted as search)" if r.start_s else ""))
    for n, why in r.config_errors.items():
        out.append(f"configuration {n}: its servers did not start: {why}")
    return out


def overlap_lines(r) -> list[str]:
    """Each feature's share of overlapped waits over the run, async on, and `overlap: LOST on
    <feature> ...` where it falls well below the rest of the run (harness.oracles.path_overlap,
    over every wait and over prefill steps; issue 36, item 4)."""
    from harness.oracles import path_overlap as po
    if not r.feature_overlap:
        return []
    out = ["overlap per feature (async on: waits overlapped of judged; prefill steps apart): " + ", ".join(
        f"{f} {sh['all'].overlapped}/{sh['all'].judged} (prefill {sh['prefill'].overlapped}/{sh['prefill'].judged})"
        for f, sh in sorted(r.feature_overlap.items()))]
    for f, sh in sorted(r.feature_overlap.items()):
        for ph in po.PHASES:
            lost, line = po.judge(f if ph == "all" else f"{f} (its prefill steps)", sh[ph], r.overlap_total[ph])
            if lost:
                out.append(line)
                break
    return out


def summary_record(res: ServedStressResult, lines: list[str]) -> dict:
    """What `stress` writes to its --out folder's summary.json (the sweep's stress reads it back:
    harness/releases/stress.py)."""
    return {"lines": lines, "cases": res.cases, "runs": res.runs, "cases_per_min": res.cases_per_min,
            "features": res.features, "rows": res.rows, "known": res.known, "claims": res.claims,
            "configs": res.configs, "config_errors": res.config_errors, "start_s": res.start_s,
            "turns": res.turns, "request_ids": res.ids, "effects": res.effects,
            "findings": [{"kind": x.finding.kind, "summary": x.finding.summary, "found_s": x.found_s,
                          "requests_found": len(x.first.requests), "requests_shrunk": len(x.best.requests),
                          "repro": x.repro, "replay_same": x.replay_same, "replays": x.replays,
                          "missed_once": x.flaky} for x in res.found],
            "interrupted": res.interrupted, "error": res.error}
