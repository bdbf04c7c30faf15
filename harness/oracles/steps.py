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

from harness.agents.vllm.steps import FIELDS, request_key

LENGTH = "FINISHED_LENGTH_CAPPED"

# Admission waits (a request left waiting with a slot, token budget and KV blocks free) are judged
# with one step of slack per request async on: a newcomer cannot join a step that is already queued
# (seed article, section 8.2), so it may sit out one schedule more than async off. Measured on stock
# 0.32.0: 0 or 1 such wait per request async on, 0 off (2026-12-04/05); a scheduler that holds
# admission back while steps are in flight leaves each newcomer waiting for the batch to drain.
ADMISSION_SLACK = 1


@dataclass
class StepBooks:
    """One arm's books summed per key: [copies, scheduled, sampled, waited, preempted, after_abort,
    admit_waits], finishes."""
    per_key: dict = field(default_factory=dict)
    finish: dict = field(default_factory=dict)  # key -> set of finish status names
    evidence: dict = field(default_factory=dict)  # key -> {mechanism: count} (vllm_steps `evidence`)


def books_of(facts: list[dict]) -> dict[str, list]:
    """vLLM request id -> its record (FIELDS order), from the agent's "steps" facts."""
    out: dict[str, list] = {}
    for f in facts:
        if f.get("role") == "steps":
            out.update(f.get("requests") or {})
    return out


def new_since(before: dict, after: dict) -> dict:
    """The records of requests that began after `before` was read (one run's)."""
    return {rid: rec for rid, rec in after.items() if rid not in before}


def summed(records: dict) -> StepBooks:
    b = StepBooks()
    ix = {k: i for i, k in enumerate(FIELDS)}
    for rec in records.values():
        key = rec[ix["key"]]
        acc = b.per_key.setdefault(key, [0, 0, 0, 0, 0, 0, 0])
        acc[0] += 1
        for j, name in enumerate(("scheduled", "sampled", "waited", "preempted", "after_abort", "admit_waits"), 1):
            acc[j] += int(rec[ix[name]]) if len(rec) > ix[name] else 0  # an older agent's books lack the last
        b.finish.setdefault(key, set()).add(rec[ix["finish"]] or "unfinished")
        ev = rec[ix["evidence"]] if len(rec) > ix["evidence"] else {}  # an older agent's books have none
        acc_ev = b.evidence.setdefault(key, {})
        for what, n in (ev or {}).items():
            acc_ev[what] = acc_ev.get(what, 0) + int(n)
    return b


def evidence_of(books: "StepBooks", r) -> dict:
    """The mechanisms the agent counted for request `r` (a Request) in one arm's books."""
    return dict(books.evidence.get(request_key(r.prompt_ids, r.max_new_tokens), {}))


@dataclass
class StepsVerdict:
    findings: list
    compared: int  # requests compared
    length_capped: int  # of which capped by max_tokens in both arms
    left_out: dict  # why -> count
    waited_on: int = 0
    waited_off: int = 0
    evidence: dict = field(default_factory=dict)  # finding -> the async-on arm's evidence for its request


def compare(reqs, off: StepBooks, on: StepBooks, parted=frozenset()) -> StepsVerdict:
    """The findings over the workload's requests (harness.engine.request.Request: prompt_ids,
    max_new_tokens, rid). `parted`: the keys of requests whose speculative windows got other draft
    counts in the two arms (harness.oracles.spec_steps.parted_keys): their sampling steps may
    differ by design, so only their waits are compared."""
    names: dict[str, list[str]] = {}
    for r in reqs:
        names.setdefault(request_key(r.prompt_ids, r.max_new_tokens), []).append(r.rid)
    findings, left, evidence = [], {}, {}
    compared = capped = w_on = w_off = 0
    for key, rids in names.items():
        a, b = off.per_key.get(key), on.per_key.get(key)
        who = "/".join(rids)

        def add(f: str, key=key) -> None:  # with the async-on arm's evidence for its request
            findings.append(f)
            evidence.setdefault(f, dict(on.evidence.get(key, {})))

        if a is None or b is None:
            left["not seen in both arms"] = left.get("not seen in both arms", 0) + 1
            continue
        fin = off.finish.get(key, set()) | on.finish.get(key, set())
        for lab, x in (("on", b), ("off", a)):  # absolute, either arm: a client that is gone gets no more work
            if x[5]:
                add(f"request {who}: {x[5]} step(s) scheduled after its abort reached the scheduler "
                    f"(async {lab}): an aborted request gets no more work")
        if a[4] or b[4]:
            left["preempted"] = left.get("preempted", 0) + 1
            continue
        if any("ABORT" in x for x in fin) or "unfinished" in fin:
            left["aborted or unfinished"] = left.get("aborted or unfinished", 0) + 1
            continue
        if a[0] != b[0]:
            left["copies differ"] = left.get("copies differ", 0) + 1
            continue
        compared += a[0]
        w_off, w_on = w_off + a[3], w_on + b[3]
        if key in parted:
            left["other draft counts"] = left.get("other draft counts", 0) + 1
        elif fin == {LENGTH}:
            capped += a[0]
            if b[2] > a[2]:
                add(f"request {who}: {b[2]} sampling steps async on, {a[2]} off (max_tokens "
                    f"{key.split(':')[1]}, capped in both): {b[2] - a[2]} step(s) past max_tokens")
        elif b[2] > a[2] + a[0]:
            add(f"request {who}: {b[2]} sampling steps async on, {a[2]} off (stopped on a token: "
                f"at most {a[0]} more allowed)")
        if b[3] > a[3]:
            add(f"request {who}: waited {b[3]} step(s) with budget free async on, {a[3]} off "
                f"(sat in the running set unscheduled, then ran)")
        if b[6] > a[6] + ADMISSION_SLACK * a[0]:
            add(f"request {who}: left waiting {b[6]} step(s) with a slot, token budget and KV blocks "
                f"free async on, {a[6]} off (the async-off arm admitted it sooner; one step more is "
                f"allowed, the queued step it cannot join)")
    return StepsVerdict(findings, compared, capped, left, w_on, w_off, evidence)


def summary_line(v: StepsVerdict) -> str:
    left = ", ".join(f"{n} {why}" for why, n in v.left_out.items())
    return (f"steps: {v.compared} requests compared ({v.length_capped} capped by max_tokens), waits with "
            f"budget free async on/off {v.waited_on}/{v.waited_off}" + (f"; left out: {left}" if left else ""))
