"""Steps are a result too: compare, per request, the steps the two arms spent on it (the agent's
books, harness.agents.vllm.steps). Async scheduling may save steps, never add them, and never
leave a request waiting with budget free where the async-off arm ran it.

Compared: the requests that ran to their end in both arms unpreempted and not aborted (a
preemption's recompute and an abort's timing differ between arms by nature; they are counted and
left out). Per request (its prompt ids and max_tokens: the key both sides know; twins share one):
- a request capped by max_tokens in both arms: as many sampling steps async on as off. One more
  is a step past max_tokens, its sample thrown away;
- a request that stopped on a token: at most one sampling step more async on than off (the step
  scheduled while its stop token was in flight: async cannot know it yet);
- waits: steps sat out in the running set with budget free, then run again: none more async on
  than off;
- admission: schedules a newcomer sat out in the waiting queue with a slot, token budget and KV
  blocks free: at most one more async on than off (ADMISSION_SLACK).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from harness.agents.vllm.steps import FIELDS, request_key
from harness.verdict import Finding

LENGTH = "FINISHED_LENGTH_CAPPED"

# Admission waits (a request left waiting with a slot, token budget and KV blocks free) are judged
# with one step of slack per request async on: a newcomer cannot join a step that is already queued
# (seed article, section 8.2), so it may sit out one schedule more than async off. Measured on stock
# 0.32.0: 0 or 1 such wait per request async on, 0 off (2026-12-04/05); a scheduler that holds
# admission back while steps are in flight leaves each newcomer waiting for the batch to drain.
ADMISSION_SLACK = 1


class StepRecord(NamedTuple):
    """One request's record in the agent's books (harness.agents.vllm.steps), by name. The agent
    writes it as a JSON object with these names; books of an older agent (and SGLang's) are a
    list in FIELDS order, possibly shorter: read by position, the missing fields empty."""
    key: str
    scheduled: int = 0
    sampled: int = 0
    waited: int = 0
    pending: int = 0
    preempted: int = 0
    finish: str = ""
    evidence: dict = {}
    after_abort: int = 0
    admit_waits: int = 0
    overlapped: int | None = None  # None: an agent that kept no per-request overlap
    early: int | None = None
    overlapped_prefill: int | None = None
    early_prefill: int | None = None

    @classmethod
    def of(cls, raw) -> "StepRecord":
        if isinstance(raw, dict):
            return cls(**{k: v for k, v in raw.items() if k in cls._fields})
        return cls(**dict(zip(FIELDS, raw)))


assert StepRecord._fields == FIELDS, "the agent's FIELDS and StepRecord name the same fields in one order"


@dataclass
class Sums:
    """One request key's records summed over its copies (twins share a key)."""
    copies: int = 0
    scheduled: int = 0
    sampled: int = 0
    waited: int = 0
    preempted: int = 0
    after_abort: int = 0
    admit_waits: int = 0


@dataclass
class StepBooks:
    """One arm's books summed per key (Sums), and the finishes and evidence per key."""
    per_key: dict = field(default_factory=dict)  # key -> Sums
    finish: dict = field(default_factory=dict)  # key -> set of finish status names
    evidence: dict = field(default_factory=dict)  # key -> {mechanism: count} (vllm_steps `evidence`)


# mechanisms of bugs that are not async scheduling's own but a batch's history (KNOWN_UPSTREAM
# vllm#43894: a row's allowed-ids mask left by an earlier request), which either arm's server may
# carry: a finding's evidence counts them from both arms (evidence_of's `other`)
EITHER_ARM = ("foreign_allowed_mask",)


def books_of(facts: list[dict]) -> dict[str, list]:
    """vLLM request id -> its record as the agent wrote it (StepRecord.of reads it), from the
    agent's "steps" facts, with the mechanisms the worker counted for the request added to its
    evidence (`request_evidence`, harness.agents.vllm.masks: the worker sees the batch's rows, the
    scheduler does not; every rank sees the same batch, so the most any rank counted)."""
    out: dict[str, list] = {}
    for f in facts:
        if f.get("role") == "steps":
            out.update(f.get("requests") or {})
    worker: dict[str, dict] = {}
    for f in facts:
        for rid, ev in (f.get("request_evidence") or {}).items() if f.get("role") == "worker" else ():
            acc = worker.setdefault(rid, {})
            for what, n in ev.items():
                acc[what] = max(acc.get(what, 0), int(n))
    for rid, ev in worker.items():
        rec = out.get(rid)
        if isinstance(rec, dict):
            out[rid] = {**rec, "evidence": {**(rec.get("evidence") or {}), **ev}}
    return out


def new_since(before: dict, after: dict) -> dict:
    """The records of requests that began after `before` was read (one run's)."""
    return {rid: rec for rid, rec in after.items() if rid not in before}


def summed(records: dict) -> StepBooks:
    b = StepBooks()
    for raw in records.values():
        rec = StepRecord.of(raw)
        acc = b.per_key.setdefault(rec.key, Sums())
        acc.copies += 1
        for name in ("scheduled", "sampled", "waited", "preempted", "after_abort", "admit_waits"):
            setattr(acc, name, getattr(acc, name) + int(getattr(rec, name)))
        b.finish.setdefault(rec.key, set()).add(rec.finish or "unfinished")
        acc_ev = b.evidence.setdefault(rec.key, {})
        for what, n in (rec.evidence or {}).items():
            acc_ev[what] = acc_ev.get(what, 0) + int(n)
    return b


def evidence_of(books: "StepBooks", r, other: "StepBooks | None" = None) -> dict:
    """The mechanisms the agent counted for request `r` (a Request) in one arm's books; with the
    `other` arm's books, that arm's counts of EITHER_ARM mechanisms added."""
    key = request_key(r.prompt_ids, r.max_new_tokens)
    return with_either_arm(books.evidence.get(key, {}), other.evidence.get(key, {}) if other is not None else {})


def with_either_arm(ev: dict, other: dict) -> dict:
    """One arm's evidence for a request, with the other arm's counts of EITHER_ARM mechanisms added."""
    out = dict(ev)
    for what, n in other.items():
        if what in EITHER_ARM and n:
            out[what] = out.get(what, 0) + int(n)
    return out


@dataclass
class StepsVerdict:
    findings: list
    compared: int  # requests compared
    length_capped: int  # of which capped by max_tokens in both arms
    left_out: dict  # why -> count
    waited_on: int = 0
    waited_off: int = 0
    evidence: dict = field(default_factory=dict)  # finding -> the async-on arm's evidence for its request


def in_flight_of(facts: list[dict]) -> int:
    """The steps the engine may keep in flight at once, from the engine (issue 45): vLLM's batch
    queue size as its engine core reported it (2 with async scheduling; pipeline size + 1 with PP
    on V2's runner); 2, one step ahead of the one it waits on, where the engine reports none
    (SGLang's overlap loop)."""
    sizes = [int(f["batch_queue_size"]) for f in facts if f.get("role") == "engine" and f.get("batch_queue_size")]
    return max(sizes) if sizes else 2


def compare(reqs, off: StepBooks, on: StepBooks, parted=frozenset(), drafted=frozenset(),
            in_flight: int = 2) -> StepsVerdict:
    """The findings over the workload's requests (harness.engine.request.Request: prompt_ids,
    max_new_tokens, rid). `parted`: the keys of requests whose speculative windows parted between
    the arms (draft counts or accepted lengths) (harness.oracles.spec_steps.parted_keys): their
    sampling steps may differ by design, so only their waits are compared. `drafted`: the keys of
    requests with speculative windows (a capped one may spend one sampling step more async on).
    `in_flight`: the steps the async-on engine may keep in flight (in_flight_of): each step it may
    schedule before the one it waits on is one step of slack where the scheduler cannot know yet
    (a stop token in flight, a queued step a newcomer cannot join); 2 is one step, as before."""
    ahead = max(1, int(in_flight) - 1)  # steps scheduled ahead of the one waited on
    names: dict[str, list[str]] = {}
    for r in reqs:
        names.setdefault(request_key(r.prompt_ids, r.max_new_tokens), []).append(r.rid)
    findings, left, evidence = [], {}, {}
    compared = capped = w_on = w_off = 0
    for key, rids in names.items():
        a, b = off.per_key.get(key), on.per_key.get(key)
        who = "/".join(rids)

        def add(text: str, code: str, key=key, rid=rids[0]) -> None:  # with the async-on arm's evidence
            f = Finding(text, code, rid)
            findings.append(f)
            evidence.setdefault(f, with_either_arm(on.evidence.get(key, {}), off.evidence.get(key, {})))

        if a is None or b is None:
            left["not seen in both arms"] = left.get("not seen in both arms", 0) + 1
            continue
        fin = off.finish.get(key, set()) | on.finish.get(key, set())
        for lab, x in (("on", b), ("off", a)):  # absolute, either arm: a client that is gone gets no more work
            if x.after_abort:
                add(f"request {who}: {x.after_abort} step(s) scheduled after its abort reached the scheduler "
                    f"(async {lab}): an aborted request gets no more work", "steps.after_abort")
        if a.preempted or b.preempted:
            left["preempted"] = left.get("preempted", 0) + 1
            continue
        if any("ABORT" in x for x in fin) or "unfinished" in fin:
            left["aborted or unfinished"] = left.get("aborted or unfinished", 0) + 1
            continue
        if a.copies != b.copies:
            left["copies differ"] = left.get("copies differ", 0) + 1
            continue
        compared += a.copies
        w_off, w_on = w_off + a.waited, w_on + b.waited
        if key in parted:  # a drafter's windows parted (draft counts or accepted lengths): steps differ by design
            left["other speculative windows"] = left.get("other speculative windows", 0) + 1
        elif fin == {LENGTH}:
            capped += a.copies
            # with drafts, vLLM's async guard at max_tokens counts only the one sure token of the step
            # in flight (its drafts may be rejected): when they are accepted and reach max_tokens, the
            # step scheduled meanwhile is one past it by design (once a request: its last step)
            if b.sampled > a.sampled + (a.copies if key in drafted else 0):
                add(f"request {who}: {b.sampled} sampling steps async on, {a.sampled} off (max_tokens "
                    f"{key.split(':')[1]}, capped in both): {b.sampled - a.sampled} step(s) past max_tokens",
                    "steps.past_cap")
        elif b.sampled > a.sampled + a.copies * ahead:
            add(f"request {who}: {b.sampled} sampling steps async on, {a.sampled} off (stopped on a token: "
                f"at most {a.copies * ahead} more allowed)", "steps.extra")
        if b.waited > a.waited:
            add(f"request {who}: waited {b.waited} step(s) with budget free async on, {a.waited} off "
                f"(sat in the running set unscheduled, then ran)", "steps.waited")
        if b.admit_waits > a.admit_waits + ADMISSION_SLACK * a.copies * ahead:
            add(f"request {who}: left waiting {b.admit_waits} step(s) with a slot, token budget and KV blocks "
                f"free async on, {a.admit_waits} off (the async-off arm admitted it sooner; "
                + ("one step more is allowed, the queued step it cannot join)" if ahead == 1 else
                   f"{ADMISSION_SLACK * ahead} steps more are allowed, the {ahead} queued steps it cannot join)"),
                "admission.starved")
    return StepsVerdict(findings, compared, capped, left, w_on, w_off, evidence)


def summary_line(v: StepsVerdict) -> str:
    left = ", ".join(f"{n} {why}" for why, n in v.left_out.items())
    return (f"steps: {v.compared} requests compared ({v.length_capped} capped by max_tokens), waits with "
            f"budget free async on/off {v.waited_on}/{v.waited_off}" + (f"; left out: {left}" if left else ""))
