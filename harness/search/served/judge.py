"""Run one served case on both servers and judge it with every oracle the gate has.

- divergence: a clear-winner divergence, async on vs off (harness.oracles.reference.divergences;
  a numerical tie is rounding, left out), and a logprob record that is not its token's
  (record_problems), in either arm;
- crash: a server died under the run (TargetCrash); hang: the watchdog stopped it (TargetHang);
  either server is started again for the next case (the finding is the case that did it);
- steps: async may save steps, never add them or leave a request waiting with budget free
  (harness.oracles.steps, from the agent's books of each request);
- books: everything back at idle in both arms (harness.oracles.books, VllmTarget.idle_books);
- placeholders: a value-reading processor of ours read a placeholder where an output id belongs
  (its counter, as the path rows' `placeholders`);
- overlap: the async server ran without overlap (the target's own check after every run);
- surface: the response fields beyond the ids (finish and stop reasons, usage, text, prompt
  logprobs: harness.oracles.surface), as the path rows judge them;
- conversations turn by turn, up to the arms' first difference (harness.oracles.turns: later turns
  have other prompts, left out and counted), and client-set request ids (harness.oracles.request_ids:
  each client its own answer, a duplicate id's disconnect ending only its own request; kind
  `request_id`).

A finding that matches a known-upstream entry live in the release (vllm_upstream.classify) is
known, not new; an entry the agent works around (its counter above 0) is known too.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

from harness.search.served.case import PAUSE_FOR_S, PAUSE_MODES, ServedCase
from harness.verdict import Finding as VFinding
from harness.verdict import code_of

RESET = "/reset_prefix_cache?reset_running_requests=true"


@dataclass
class Finding:
    kind: str  # divergence | record | crash | hang | steps | books | placeholders | overlap | surface | request_id
    summary: str
    signature: tuple  # what must stay the same while shrinking and on replay
    # the oracle's finding code (harness.verdict.Finding.code; "": the kind's) and the request it is
    # about: what a known-upstream entry claims it by (never the summary's words); not serialised
    code: str = ""
    rid: str = ""

    def as_finding(self) -> VFinding:
        return VFinding(self.summary, self.code or self.kind, self.rid)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "summary": self.summary, "signature": list(self.signature)}


@dataclass
class Verdict:
    new: list = field(default_factory=list)  # Finding
    known: list = field(default_factory=list)  # (known id, what)
    # (known id, Finding) of each finding an entry claimed, and what testing them without the
    # entry's trigger gave (harness.search.served.claims: tested, held, refuted, untestable)
    claimed: list = field(default_factory=list)
    claims: dict = field(default_factory=dict)
    counts_on: dict = field(default_factory=dict)  # the agent's counters over the run (deltas)
    counts_off: dict = field(default_factory=dict)
    # finding summary -> the mechanisms the agent counted for its request, async on (issue 36: what
    # a known-upstream entry needs to claim it)
    evidence: dict = field(default_factory=dict)
    refused: str = ""  # the server refused a request (a case we should not have drawn): not judged
    # feature -> {"all": Share, "prefill": Share}: its requests' waits, async on (issue 36, item 4)
    feature_overlap: dict = field(default_factory=dict)
    overlap_total: dict = field(default_factory=dict)  # "all"/"prefill" -> Share of every request of the case
    turns: dict = field(default_factory=dict)  # conversations, turns judged and left out (oracles.turns.comparable)
    server_aborted: int = 0  # answers cut by /pause?mode=abort, judged as prefixes (oracles.pause_abort)
    # answers the server failed (a 5xx, or an error event mid-stream), per arm: their ids judged, no
    # more (said in the summary: a draw the engine fails in both arms is coverage lost)
    server_errors: list = field(default_factory=list)  # (arm, rid, "server error CODE: MESSAGE")
    effects: dict = field(default_factory=dict)  # (rid, param) -> it changed the async-off answer (served_effects)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return bool(self.new)

    def signature(self):
        return self.new[0].signature if self.new else None


def _controls(target, overlap: bool, controls, done: threading.Event, got: list):
    import httpx
    from harness.targets.served import openai_wire
    base, t0 = target.url(overlap), time.monotonic()
    with openai_wire.client(30.0) as c:
        for at, what in controls:
            if done.wait(max(0.0, t0 + at - time.monotonic())):
                return  # the run ended first
            try:
                if what in PAUSE_MODES:  # mode wait answers once the running requests drained
                    path = pause_path(target, PAUSE_MODES[what])
                    if path is None:  # the release has no such pause: the case runs without it
                        got.append((what, "n/a"))
                        continue
                    got.append((what, c.post(base + path).status_code))
                    time.sleep(PAUSE_FOR_S)
                    got.append(("resume", c.post(base + "/resume").status_code))
                else:
                    got.append(("reset", c.post(base + RESET).status_code))
            except httpx.HTTPError as e:
                got.append((what, type(e).__name__))


def pause_path(target, mode: str) -> str | None:
    """The target's POST for /pause in `mode` (its release's own words: VllmTarget.pause_path), or
    None where it has no such mode."""
    own = getattr(target, "pause_path", None)
    return own(mode) if own is not None else f"/pause?mode={mode}"


def run_arm(target, case: ServedCase, overlap: bool, agent: bool = True) -> dict:
    """One arm: its Run, the agent's counter deltas, the step books of its requests, its books at
    idle, the control answers; or {"error": Finding} when the server crashed or hung."""
    from harness.agents import plan as planmod
    from harness.oracles import spec_steps, steps
    from harness.targets.vllm import paths as vp
    from harness.targets.base import TargetCrash, TargetHang
    done, got = threading.Event(), []
    ctl = threading.Thread(target=_controls, args=(target, overlap, case.controls, done, got), daemon=True)
    arm = "on" if overlap else "off"
    try:
        # a server lost in an earlier case (or on other source patches) starts here, not inside
        # the run's bound, and before its facts are read: those of a stopped server count nothing
        target.url(overlap)
        # a drafter's judgements (SGLang's agent, harness/agents/sglang/spec.py) are read with or without the rest
        spec = bool(getattr(target, "spec", None)) and hasattr(target, "facts_dir")
        facts = planmod.read_facts(str(target.facts_dir(overlap))) if agent or spec else []
        before, books_before = vp.counts(facts), steps.books_of(facts)
        spec_before, verified_before = spec_steps.accepted_of(facts), spec_steps.verified_of(facts)
        if case.controls:
            ctl.start()
        try:
            run = target.run(case.requests, overlap=overlap,
                             delays=(case.delays or {}) if (overlap and agent and case.delays) else None)
        finally:
            done.set()
            if ctl.is_alive():
                ctl.join(5.0)
    except TargetCrash as e:
        return {"error": Finding("crash", f"async {arm}: {e}"[:400], ("crash", arm, _exception(str(e))))}
    except TargetHang as e:
        return {"error": Finding("hang", f"async {arm}: {e}"[:400], ("hang", arm))}
    out = {"run": run, "controls": got}
    if spec and not agent:
        time.sleep(0.3)  # the agent flushes its counters every 0.1 s
        out["counts"] = vp.delta(before, vp.counts(planmod.read_facts(str(target.facts_dir(overlap)))))
    if agent:
        out["books"] = target.idle_books(overlap)
        time.sleep(0.1)  # the agent flushes its counters every 0.1 s
        facts = planmod.read_facts(str(target.facts_dir(overlap)))
        out["counts"] = vp.delta(before, vp.counts(facts))
        out["steps"] = steps.new_since(books_before, steps.books_of(facts))
        out["spec"] = spec_steps.new_since(spec_before, spec_steps.accepted_of(facts))  # a drafter's windows
        out["verified"] = spec_steps.new_since(verified_before, spec_steps.verified_of(facts))
    return out


def _exception(text: str) -> str:
    """A crash's exception type and message without numbers (the same crash on replay)."""
    m = re.search(r"ran: (.*?)(?: \(log |$)", text)
    text = re.sub(r"\b[0-9a-fA-F]*\d[0-9a-fA-F-]{6,}", "X", m.group(1) if m else text)  # request ids, addresses
    return re.sub(r"\d+", "N", text)[:120]


def judge(target, case: ServedCase, version: str | None = None, agent: bool = True, claims: bool = True) -> Verdict:
    """Both arms of one case (off first: the reference), every oracle; the servers are started
    again where one was lost. Each finding a known entry claims is tested by the case run again
    without the entry's trigger (`claims`; harness.search.served.claims): one that stays is new.
    The run without the trigger (claims=False) judges findings only: no parameter's effect."""
    from harness.targets.base import AgentFault, TargetError
    t0 = time.monotonic()
    v = Verdict()
    arms = {}
    try:
        for overlap in (False, True):
            arms[overlap] = run_arm(target, case, overlap, agent)
    except AgentFault as e:  # our agent's own error: not judged, said in the summary (never the engine's)
        v.refused = f"the harness's own error: {e}"[:300]
        v.seconds = time.monotonic() - t0
        return v
    except TargetError as e:  # refused (400: a request the server will not take) or overlap lost
        msg = str(e)
        if "refused with 4" in msg:
            v.refused = msg[:300]
        elif "overlap" in msg:
            v.new.append(Finding("overlap", msg[:300], ("overlap",)))
        else:
            raise
        v.seconds = time.monotonic() - t0
        return v
    finally:
        restart_lost(target)
    errors = [a["error"] for a in arms.values() if "error" in a]
    if not errors:
        from harness.oracles import pause_abort, surface, turns
        raw_off = arms[False]["run"]
        v.server_errors = [(lab, rid, str(f)) for lab, ov in (("off", False), ("on", True))
                           for rid, _, f in arms[ov]["run"].outputs if str(f).startswith("server error")]
        off_run, on_run, v.turns = turns.comparable(raw_off, arms[True]["run"])
        off_run, on_run, cut = pause_abort.comparable(case, off_run, on_run)
        v.server_aborted = len(cut)
        arms = {False: {**arms[False], "run": off_run, "cut": cut}, True: {**arms[True], "run": on_run, "cut": cut}}
        tok = target.tokenizer() if hasattr(target, "tokenizer") else None
        v.new += _findings(case, arms[False], arms[True], agent, v.evidence, surface.detokenizer(tok),
                           left_out={rid: w[1] for rid, w in (getattr(target, "left_out", None) or {}).items()})
        v.new = drop_unjudged(target, case, v.new)
        if getattr(target, "spec", None):  # a drafter's invariants, judged inside the scheduler
            from harness.targets.sglang.spec import violation_lines
            v.new += [Finding("spec", line, ("spec", counter), counter)
                      for counter, line in violation_lines(arms[True].get("counts", {}), arms[False].get("counts", {}))]
        if agent:
            v.feature_overlap, v.overlap_total = feature_overlap(case, arms[True].get("steps") or {})
        v.effects = _effects(target, case, raw_off, cut, v) if claims else {}
        v.counts_on, v.counts_off = arms[True].get("counts", {}), arms[False].get("counts", {})
    else:
        v.new += errors
        for a in arms.values():
            if "counts" in a:
                v.counts_on = a["counts"]
    if getattr(target, "name", "") == "sglang" and not errors:
        claim_sglang(v, case, arms[True]["run"])
    runner = getattr(target, "runner", None)
    _classify(v, version, runner)
    if claims and v.claimed:
        from harness.search.served import claims as served_claims
        served_claims.test(lambda c: judge(target, c, version, agent, claims=False), case, v, version, runner)
    v.seconds = time.monotonic() - t0
    return v


def drop_unjudged(target, case: ServedCase, found: list) -> list:
    """The divergences of requests whose tokens this target cannot compare across the arms (SGLang
    samples a temperature > 0 request unseeded here: harness.oracles.reference.unjudged) are not
    findings; their records are still judged. (On a CPU with a drafter SGLang verifies greedily, so
    only such a request's first token is sampled: the one it diverged on, found by stress.)"""
    from harness.oracles.reference import unjudged
    rids, _ = unjudged(target, case.requests)
    return [f for f in found if not (f.kind == "divergence" and f.rid in rids)]


def claim_sglang(v: Verdict, case: ServedCase, on_run) -> None:
    """SGLang's known-upstream entries (harness.targets.sglang.upstream) claim a finding only with
    their mechanism counted for its request in this run, overlap on (the agent's facts the Run keeps)."""
    from harness.targets.sglang import upstream as sglang_upstream
    from harness.targets.vllm import upstream as vllm_upstream
    s = getattr(on_run, "summary", None) or {}
    evidence = sglang_upstream.evidence_for(case.requests, sglang_upstream.stale_by_request(
        s.get("facts") or [], s.get("facts_before") or []))
    rows = sorted({k.row for k in sglang_upstream.KNOWN})
    both = {k: v.counts_on.get(k, 0) + v.counts_off.get(k, 0) for k in set(v.counts_on) | set(v.counts_off)}
    keep = []
    for f in v.new:
        hit = None
        for row in rows:
            _, seen, _ = vllm_upstream.classify(row, [f.as_finding()], known=sglang_upstream.KNOWN, counts=both,
                                                evidence=evidence)
            hit = next((kid for kid, _ in seen), None)
            if hit:
                break
        if hit:
            v.known.append((hit, f.summary))
            v.claimed.append((hit, f))  # tested without its trigger too (harness.search.served.claims)
        else:
            keep.append(f)
    v.new = keep


def _effects(target, case, off_run, cut, v: Verdict) -> dict:
    """Item 3's rule (harness.search.served.effects): each drawn parameter of the async path sent
    once more without it, async off. A server lost in that run is a finding and is started again
    by the next case; the parameters then count as not judged (no entry), never as having had an
    effect."""
    from harness.search.served import effects as served_effects
    from harness.targets.base import TargetCrash, TargetError, TargetHang
    try:
        return served_effects.check(target, case, off_run, cut)
    except TargetCrash as e:
        v.new.append(Finding("crash", f"async off (the run without the drawn parameters): {e}"[:400],
                             ("crash", "off", _exception(str(e)))))
    except TargetHang as e:
        v.new.append(Finding("hang", f"async off (the run without the drawn parameters): {e}"[:400], ("hang", "off")))
    except TargetError:  # a copy refused: its parameters not judged
        return {}
    restart_lost(target)
    return {}


def feature_overlap(case, books: dict) -> dict:
    """(feature -> its share, the whole case's share): each drawn feature's share of overlapped
    waits in this case, async on, over every wait of the requests that drew it and over their
    prefill steps (harness.oracles.path_overlap)."""
    from harness.oracles import path_overlap as po
    from harness.search.served.case import features
    keys = {ph: po.by_key(books, ph) for ph in po.PHASES}
    out: dict = {}
    for r in case.requests:
        for f in features(r):
            acc = out.setdefault(f, {ph: po.Share() for ph in po.PHASES})
            for ph in po.PHASES:
                acc[ph] = acc[ph].add(po.share_of([r], keys[ph]))
    return out, {ph: po.share_of(case.requests, keys[ph]) for ph in po.PHASES}


def restart_lost(target) -> None:
    """A server the watchdog stopped or that died is started again by the next run (lazily)."""
    for d in (getattr(target, "hung", {}), getattr(target, "crashed", {})):
        d.clear()


def _findings(case, off: dict, on: dict, agent: bool, evidence: dict | None = None, decode=None,
              left_out=None) -> list[Finding]:
    """Every oracle's findings; `evidence` (when given) gets, per finding, the mechanisms the agent
    counted for the request it names, async on; `decode` (ids -> text) lets the surface oracle
    check each text against its ids."""
    from harness.oracles import books as bookmod
    from harness.oracles import request_ids, spec_steps, steps, surface, turns
    from harness.oracles.divergence import record_problems, run_logprobs
    from harness.oracles.reference import divergences
    from harness.targets.vllm import paths as vp
    evidence = {} if evidence is None else evidence
    out = []
    # a chat turn (rid@k) is a request of its own, keyed in the agent's books by the prompt ids
    # its client sent (the template's), not by its conversation's first prompt
    reqs = case.requests + turns.as_requests(case.requests, on["run"])
    preempted = _sampled_preempted(reqs, on) if agent else set()
    on_books = steps.summed(on.get("steps") or {}) if agent else None
    # a batch-history mechanism (steps.EITHER_ARM) may have hit either arm's request
    off_books = steps.summed(off.get("steps") or {}) if agent else None
    by_rid = {r.rid: r for r in reqs}
    spec = {True: on.get("spec") or {}, False: off.get("spec") or {}} if agent else {}
    # a drafter's configuration: a sampled request the arms drafted for differently draws differently
    verified = {True: on.get("verified") or {}, False: off.get("verified") or {}} if agent else {}
    apart = spec_steps.sampled_apart(reqs, verified)
    for _, _, divs in divergences(off["run"], on["run"]):
        for d in divs:
            if not d.near_tie and d.rid.split("#")[0] not in apart:
                r = by_rid.get(d.rid.split("#")[0])
                ev = steps.evidence_of(on_books, r, off_books) if on_books is not None and r is not None else {}
                dropped = {m.split(":", 1)[1]: n for m, n in ev.items() if m.startswith("stale_dropped:") and n}
                why = (" (a sampled request preempted async on" + (
                    f"; its in-flight sample dropped on the {', '.join(sorted(dropped))} path" if dropped else "")
                    + ")") if d.rid.split("#")[0] in preempted else ""
                f = Finding("divergence", f"request {d.rid} diverges at token {d.position} ({d.verdict}): "
                            f"off {d.expected[:6]} vs on {d.got[:6]}{why}", ("divergence",),
                            "divergence.sampled_preempted" if why else "divergence", d.rid.split("#")[0])
                evidence[f.summary] = ev
                out.append(f)
    for rid, whats in sorted(surface.findings(case.requests, off["run"], on["run"], decode, left_out).items()):
        r = by_rid.get(rid)
        for what in whats:  # the field, without figures, is what a replay must show again
            out.append(Finding("surface", f"request {rid}: {what}", ("surface", _field(what)), code_of(what), rid))
            evidence[out[-1].summary] = steps.evidence_of(on_books, r, off_books) if on_books is not None and r else {}
    for rid, whats in sorted(request_ids.findings(case.requests, off["run"], on["run"], off.get("cut")).items()):
        for what in whats:
            out.append(Finding("request_id", f"request {rid}: {what}", ("request_id", _id_kind(what))))
    for lab, a in (("on", on), ("off", off)):
        run = a["run"]
        out += [Finding("record", f"async {lab}: {p}", ("record", lab)) for p in record_problems(run.outputs,
                                                                                                 run_logprobs(run))]
    if not agent:
        return out
    sv = steps.compare(reqs, steps.summed(off["steps"]), steps.summed(on["steps"]),
                       spec_steps.parted_keys(spec[True], spec[False]) if any(spec.values()) else (),
                       {k for ov in (True, False) for k, _ in (spec.get(ov) or {}).values()},
                       in_flight=steps.in_flight_of(getattr(on["run"], "summary", {}).get("facts") or []))
    for f in sv.findings:
        # the signature a replay must show again, by the oracle's code (the words of older reproducers)
        kind = {"steps.past_cap": "past max_tokens", "steps.after_abort": "after abort",
                "admission.starved": "admission", "steps.waited": "waited"}.get(code_of(f), "more steps")
        out.append(Finding("steps", f"steps: {f}", ("steps", kind), code_of(f), f.rid))
        evidence[out[-1].summary] = sv.evidence.get(f, {})
    if any(verified.values()):  # a drafter: the verify rule, window by window, on the greedy requests
        from harness.agents.vllm.steps import request_key
        greedy = [request_key(r.prompt_ids, r.max_new_tokens) for r in reqs if not r.temperature]
        for overlap, arm in ((True, "on"), (False, "off")):
            for f in spec_steps.verify_findings(verified[overlap], greedy, arm)[0]:
                out.append(Finding("spec", f, ("spec", "verify", arm)))
    for f in bookmod.findings(on["books"], off["books"]):
        if bookmod.HELD["host_buffers_held"] in f and all(
                bookmod.HELD["host_buffers_held"] in g for g in bookmod.leaks(on["books"], "on")):
            # the worker writes its books after its step, before the output thread reads that step's
            # ids and frees the buffer (harness.agents.vllm.books.worker_books): after the last step
            # of a run nothing rewrites them, so a held buffer alone at idle is not judged (measured:
            # it did not replay)
            continue
        what = re.sub(r"^async (on|off): \d+ ", "", f).split(" at idle")[0]
        out.append(Finding("books", f"books: {f}", ("books", f.split(":")[0], what)))
    for row in vp.PATHS:
        if row.violations and row.pair == "main":  # an invariant the agent checks where the path runs
            counter, what = row.violations
            for lab, a in (("on", on), ("off", off)):
                if a["counts"].get(counter, 0):
                    out.append(Finding("placeholders", f"async {lab}: {a['counts'][counter]} {what} ({counter})",
                                       ("placeholders", counter)))
        if row.placeholders and row.pair == "main":
            for lab, a in (("on", on), ("off", off)):
                k = a["counts"].get(row.placeholders, 0)
                if k:
                    out.append(Finding("placeholders", f"async {lab}: a logits processor read {k} placeholder(s) "
                                       f"where an output token id belongs ({row.placeholders})",
                                       ("placeholders", row.placeholders)))
    return out


def _field(what: str) -> str:
    """The response field a surface finding is about (its signature: the figures may change)."""
    m = re.search(r"\b(finish_reason|stop_reason|usage\.\w+|text|prompt_logprobs|ids returned)", what)
    return m.group(1) if m else "surface"


def _id_kind(what: str) -> str:
    """A request-id finding's kind, without figures (its signature)."""
    return ("crossed" if "crossed" in what else "cut short" if "ended" in what else
            "response id" if "response id" in what else "request_id")


def _sampled_preempted(reqs, on: dict) -> set:
    """The rids of requests (chat turns included) that sample (temperature > 0) and that the
    async-on arm preempted, by the agent's step books (what KNOWN_UPSTREAM
    async-seeded-preempt-in-flight claims)."""
    from harness.agents.vllm.steps import request_key
    from harness.oracles import steps
    books = steps.summed(on.get("steps") or {}).per_key
    return {r.rid for r in reqs if r.temperature > 0
            and (books.get(request_key(r.prompt_ids, r.max_new_tokens)) or steps.Sums()).preempted > 0}


def _classify(v: Verdict, version: str | None, runner: str | None = None) -> None:
    """Move the findings a known-upstream entry claims (live in `version`) to v.known; note the
    entries the agent worked around. The bare pair's entries (vllm#52461) cannot show on the main
    pair (a CLI processor turns vLLM's repair on), so they never claim a finding here."""
    from harness.targets.vllm import paths as vp
    from harness.targets.vllm import upstream as vllm_upstream
    both = {k: v.counts_on.get(k, 0) + v.counts_off.get(k, 0) for k in set(v.counts_on) | set(v.counts_off)}
    rows = sorted({k.row for k in vllm_upstream.KNOWN_UPSTREAM
                   if k.row not in vp.PATHS_BY_NAME or vp.PATHS_BY_NAME[k.row].pair == "main"})
    for row in rows:
        _, seen, _ = vllm_upstream.classify(row, [], counts=both, version=version, runner=runner)
        v.known += seen
    new = []
    for f in v.new:
        hit, said = None, f.summary
        for row in rows:
            found, seen, _ = vllm_upstream.classify(row, [f.as_finding()], counts=both, version=version, runner=runner,
                                         evidence=lambda s: v.evidence.get(s, {}))
            hit = next((kid for kid, what in seen if what == f.summary), None)
            if hit:
                break
            if found and found[0] != f.summary:  # it looks like a known one without its evidence: said so
                said = found[0]
        if hit:
            v.known.append((hit, f.summary))
            v.claimed.append((hit, f))
        else:
            f.summary = said
            new.append(f)
    v.new = new
