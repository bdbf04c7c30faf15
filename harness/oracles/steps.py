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
  than off.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from harness.agents.vllm.steps import FIELDS, request_key

LENGTH = "FINISHED_LENGTH_CAPPED"


@dataclass
class StepBooks:
    """One arm's books summed per key: [copies, scheduled, sampled, waited, preempted], finishes."""
    per_key: dict = field(default_factory=dict)
    finish: dict = field(default_factory=dict)  # key -> set of finish status names


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
        acc = b.per_key.setdefault(key, [0, 0, 0, 0, 0])
        acc[0] += 1
        for j, name in enumerate(("scheduled", "sampled", "waited", "preempted"), 1):
            acc[j] += int(rec[ix[name]])
        b.finish.setdefault(key, set()).add(rec[ix["finish"]] or "unfinished")
    return b


@dataclass
class StepsVerdict:
    findings: list
    compared: int  # requests compared
    length_capped: int  # of which capped by max_tokens in both arms
    left_out: dict  # why -> count
    waited_on: int = 0
    waited_off: int = 0


def compare(reqs, off: StepBooks, on: StepBooks) -> StepsVerdict:
    """The findings over the workload's requests (harness.engine.request.Request: prompt_ids,
    max_new_tokens, rid)."""
    names: dict[str, list[str]] = {}
    for r in reqs:
        names.setdefault(request_key(r.prompt_ids, r.max_new_tokens), []).append(r.rid)
    findings, left = [], {}
    compared = capped = w_on = w_off = 0
    for key, rids in names.items():
        a, b = off.per_key.get(key), on.per_key.get(key)
        who = "/".join(rids)
        if a is None or b is None:
            left["not seen in both arms"] = left.get("not seen in both arms", 0) + 1
            continue
        fin = off.finish.get(key, set()) | on.finish.get(key, set())
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
        if fin == {LENGTH}:
            capped += a[0]
            if b[2] > a[2]:
                findings.append(f"request {who}: {b[2]} sampling steps async on, {a[2]} off (max_tokens "
                                f"{key.split(':')[1]}, capped in both): {b[2] - a[2]} step(s) past max_tokens")
        elif b[2] > a[2] + a[0]:
            findings.append(f"request {who}: {b[2]} sampling steps async on, {a[2]} off (stopped on a token: "
                            f"at most {a[0]} more allowed)")
        if b[3] > a[3]:
            findings.append(f"request {who}: waited {b[3]} step(s) with budget free async on, {a[3]} off "
                            f"(sat in the running set unscheduled, then ran)")
    return StepsVerdict(findings, compared, capped, left, w_on, w_off)


def summary_line(v: StepsVerdict) -> str:
    left = ", ".join(f"{n} {why}" for why, n in v.left_out.items())
    return (f"steps: {v.compared} requests compared ({v.length_capped} capped by max_tokens), waits with "
            f"budget free async on/off {v.waited_on}/{v.waited_off}" + (f"; left out: {left}" if left else ""))
