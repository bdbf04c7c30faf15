"""Speculative windows on the real engine (issue 43, item 2): a greedy request's accepted lengths
are the same async on and off.

The agent (harness.agents.vllm.spec) records, per request, each window's drafts scheduled and
drafts accepted. With a greedy request and a greedy drafter, a window's accepted length is a
function of the tokens so far and how many drafts the step gave it, so where the two arms gave a
request the same draft counts step for step, the accepted lengths must match step for step (a
verify that drops a match, or a drafter fed a stale token or position under overlap, changes them
while the tokens may stay right: the rejection sampler's correction hides it). Where the arms'
schedules gave different draft counts (the token budget trims drafts, a preemption recomputes),
the request is not comparable and is counted as such, never passed.

This is the windows' counterpart of harness.oracles.acceptance (the reference engine's oracle
drafter, whose acceptance is drawn): here the drafter is a real model and only the two arms'
agreement is judged. Findings are plain lines (one per request).
"""
from __future__ import annotations

ROLE = "spec"


def accepted_of(facts: list[dict]) -> dict:
    """vLLM request id -> (key, [[drafts, accepted], ...]) from the engine core's spec facts."""
    out = {}
    for f in facts:
        if f.get("role") == ROLE:
            for rid, (key, wins) in (f.get("accepted") or {}).items():
                out[rid] = (key, [tuple(w) for w in wins])
    return out


def new_since(before: dict, after: dict) -> dict:
    """The requests a run added (the facts hold the server's whole life; request ids are new per run)."""
    return {rid: v for rid, v in after.items() if rid not in before}


def _by_key(acc: dict) -> dict:
    """key -> the window lists of the requests with that key (twins share one), in a stable order."""
    out: dict = {}
    for key, wins in acc.values():
        out.setdefault(key, []).append(wins)
    return {k: sorted(v) for k, v in out.items()}


def compare(on: dict, off: dict, keys) -> tuple[list[str], int, int]:
    """(findings, requests compared, requests whose draft counts part between the arms) over the
    request keys `keys` (the greedy requests). Window by window from the first: while both arms gave
    the request the same number of drafts and accepted the same so far, the accepted lengths must
    match; the first window with other draft counts ends the comparable part (the schedules parted:
    the token budget trimmed drafts, a preemption recomputed)."""
    findings, compared, parted = [], 0, 0
    for key, w_on, w_off in _pairs(on, off, keys):
        compared += 1
        for i, ((k, x), (k2, y)) in enumerate(zip(w_on, w_off)):
            if k != k2:
                parted += 1
                break
            if x != y:
                findings.append(f"request {key}: window {i} ({k} drafts) accepted {x} async on, {y} off "
                                f"(on {[x for _, x in w_on][:12]}, off {[y for _, y in w_off][:12]})")
                break
    return findings, compared, parted


def parted_keys(on: dict, off: dict) -> set:
    """The request keys whose draft counts per window differ between the arms: their steps may
    differ by design (the steps oracle leaves them out, as it does a preempted request)."""
    return {key for key, w_on, w_off in _pairs(on, off, set(_by_key(on)) | set(_by_key(off)))
            if [k for k, _ in w_on] != [k for k, _ in w_off]} | (set(_by_key(on)) ^ set(_by_key(off)))


# why a sampled request whose windows parted is not compared token for token
SAMPLED_APART = ("a sampled request's random draws in a step with drafts (the rejection sampler's uniforms, one per "
                 "draft, the recovered tokens' noise and the bonus token's sample) follow how many drafts the step "
                 "gave it, which the token budget and the async placeholders decide per arm: seeded tokens equal "
                 "only where the windows did")


def sampled_apart(reqs, spec: dict) -> set:
    """The workload's sampled requests (temperature > 0: seeded or n > 1) whose draft counts per
    window parted between the arms (spec: overlap -> accepted_of): their tokens are not comparable
    (SAMPLED_APART). Greedy requests stay compared: the argmax does not depend on the windows."""
    if not spec:
        return set()
    from harness.agents.vllm.steps import request_key
    parted = parted_keys(spec.get(True, {}), spec.get(False, {}))
    return {r.rid for r in reqs if getattr(r, "temperature", None)
            and request_key(r.prompt_ids, r.max_new_tokens) in parted}


def _pairs(on: dict, off: dict, keys):
    a, b = _by_key(on), _by_key(off)
    for key in sorted(set(keys)):
        if key in a and key in b and len(a[key]) == len(b[key]):
            for w_on, w_off in zip(a[key], b[key]):
                yield key, w_on, w_off


def summary(acc: dict) -> dict:
    """windows, drafts, accepted, acceptance rate and mean accepted length (bonus included) of a run."""
    wins = [w for _, ws in acc.values() for w in ws]
    drafts = sum(k for k, _ in wins)
    accepted = sum(x for _, x in wins)
    return {"windows": len(wins), "drafts": drafts, "accepted": accepted,
            "rate": round(accepted / drafts, 3) if drafts else None,
            "mean_len": round(1 + accepted / len(wins), 3) if wins else None}
