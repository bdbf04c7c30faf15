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

import re

ROLE = "spec"
VERIFY_ROLE = "spec_verify"  # the worker's drafts and sampled ids per window (harness.agents.vllm.spec)


def accepted_of(facts: list[dict]) -> dict:
    """vLLM request id -> (key, [[drafts, accepted], ...]) from the engine core's spec facts."""
    out = {}
    for f in facts:
        if f.get("role") == ROLE:
            for rid, (key, wins) in (f.get("accepted") or {}).items():
                out[rid] = (key, [tuple(w) for w in wins])
    return out


def verified_of(facts: list[dict]) -> dict:
    """vLLM request id -> (key, [(drafts, sampled ids), ...]) from the worker's spec_verify facts."""
    out = {}
    for f in facts:
        if f.get("role") == VERIFY_ROLE:
            for rid, (key, wins) in (f.get("verified") or {}).items():
                out[rid] = (key, [(list(d), list(s)) for d, s in wins])
    return out


def verify_findings(verified: dict, greedy_keys, arm: str) -> tuple[list[str], int]:
    """(findings, windows checked): the verify rule, window by window, for the greedy requests
    (`greedy_keys`). Greedy, a draft is accepted exactly when it is the target's argmax there, and
    the token after the accepted ones is that argmax: so the sampled ids are the drafts' longest
    prefix accepted and then one token that is not the next draft (the correction), or, all
    accepted, the bonus token. A sampled id that breaks it (a match rejected, a mismatch accepted,
    a window longer than its drafts + 1) is a verify bug whatever the tokens' equality says."""
    keys, found, checked = set(greedy_keys), [], 0
    for rid, (key, wins) in sorted(verified.items()):
        if key not in keys:
            continue
        for i, (d, s) in enumerate(wins):
            checked += 1
            a = len(s) - 1
            ok = 0 <= a <= len(d) and s[:a] == d[:a] and (a == len(d) or s[a] != d[a])
            if not ok:
                found.append(f"async {arm}: request {key}: window {i}: drafts {d} verified as {s} (greedy: the "
                             "accepted drafts, then one token that is not the next draft)")
                break
    return found, checked


def drafts_apart(on: dict, off: dict, greedy_keys) -> tuple[int, int]:
    """(windows compared, windows whose drafts differ) over the greedy requests, window by window
    while the arms' sampled ids agree: the same context given the same drafter should draft the
    same ids; a difference there is the drafter's numerics in another batch (a near tie of its
    argmax) or a drafter fed another context (reported, not judged: no logprobs tell them apart)."""
    a, b = _by_key_v(on), _by_key_v(off)
    compared = apart = 0
    for key in sorted(set(greedy_keys) & set(a) & set(b)):
        if len(a[key]) != len(b[key]):
            continue
        for w_on, w_off in zip(a[key], b[key]):
            for (d1, s1), (d2, s2) in zip(w_on, w_off):
                compared += 1
                apart += int(d1 != d2)
                if s1 != s2:
                    break
    return compared, apart


def _by_key_v(v: dict) -> dict:
    """key -> the window lists of the requests with that key. The children of an n > 1 request share
    its key and are paired across the arms by their index (vLLM's child id `<index>_<parent id>`, the
    index of the choice the harness names `#<index>`): sorted by content, a child's windows would be
    paired with a sibling's, which drafted alike and sampled other ids (each child draws on its own),
    and a child drafted for apart would be compared as if its draws were the same."""
    out: dict = {}
    for rid, (key, wins) in v.items():
        out.setdefault(key, []).append((_child_index(rid), wins))
    return {k: [w for _, w in sorted(x)] for k, x in out.items()}


def _child_index(rid) -> int:
    """The choice index of an n > 1 request's child (vLLM's ParentRequest.get_child_info), else -1."""
    m = re.match(r"(\d+)_", str(rid))
    return int(m.group(1)) if m else -1


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
    the token budget trimmed drafts, a preemption recomputed). Sound where the drafter's drafts
    follow from the tokens alone (SGLang's NGRAM: a trie lookup; harness.targets.sglang.spec); a
    draft model's batched argmax may flip at near ties between the arms, so vLLM's windows are
    judged per arm instead (verify_findings)."""
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
    """The request keys whose windows differ between the arms, in draft counts or accepted
    lengths: their steps (and a sampled request's draws) may differ by design, the steps oracle
    leaves their step counts out as it does a preempted request's. Draft counts part where the
    token budget or the async placeholders trim drafts; accepted lengths where the drafter drafted
    other ids (its argmax in another batch, or a sampled request's draws). That a greedy window
    accepted what its drafts deserve is verify_findings' to judge, per arm."""
    return {key for key, w_on, w_off in _pairs(on, off, set(_by_key(on)) | set(_by_key(off)))
            if w_on != w_off} | (set(_by_key(on)) ^ set(_by_key(off)))


# why a sampled request whose windows parted is not compared token for token
SAMPLED_APART = ("a sampled request's random draws in a step with drafts (the rejection sampler's uniforms, one per "
                 "draft, the recovered tokens' noise and the bonus token's sample) follow how many drafts the step "
                 "gave it, which the token budget and the async placeholders decide per arm: seeded tokens equal "
                 "only where the windows did")


def sampled_apart(reqs, verified: dict) -> set:
    """The workload's sampled requests (temperature > 0: seeded or n > 1) that the arms drafted for
    differently before their sampled ids parted (verified: overlap -> verified_of): another draft
    count or other draft ids in a window while the ids sampled so far agree. Their tokens are not
    comparable (SAMPLED_APART). A sampled request whose ids part in a window with the same drafts
    stays compared (its draws were the same), as do greedy requests (the argmax does not depend on
    the windows)."""
    if not verified or not (verified.get(True) or verified.get(False)):
        return set()
    from harness.agents.vllm.steps import request_key
    a, b = _by_key_v(verified.get(True) or {}), _by_key_v(verified.get(False) or {})
    out = set()
    for r in reqs:
        key = request_key(r.prompt_ids, r.max_new_tokens)
        if not getattr(r, "temperature", None) or (key not in a and key not in b):
            continue
        if key not in a or key not in b or len(a[key]) != len(b[key]):
            out.add(r.rid)
            continue
        for w_on, w_off in zip(a[key], b[key]):
            if _drafted_apart(w_on, w_off):
                out.add(r.rid)
    return out


def _drafted_apart(w_on, w_off) -> bool:
    for (d1, s1), (d2, s2) in zip(w_on, w_off):
        if d1 != d2:
            return True
        if s1 != s2:
            return False  # the same drafts, other ids: a real divergence of its draws
    return len(w_on) != len(w_off)


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


def summary_line(acc: dict) -> str:
    """One arm's windows in the gate's words: acceptance and the accepted lengths' histogram."""
    sm = summary(acc)
    if not sm["windows"]:
        return "no window"
    hist: dict = {}
    for _, ws in acc.values():
        for _, x in ws:
            hist[x] = hist.get(x, 0) + 1
    return (f"{sm['windows']} windows, {sm['accepted']} of {sm['drafts']} drafts accepted ({sm['rate']:.1%}), mean "
            f"length {sm['mean_len']} (accepted lengths " + ", ".join(f"{k}: {hist[k]}" for k in sorted(hist)) + ")")
