"""A claim must explain the whole finding (issue 44, item 1).

A known-upstream entry claims a finding by its code and the mechanism the agent counted for its
request (harness.targets.vllm.upstream.classify). That is not enough when a case sets off two
mechanisms: a request preempted both by a reset (the entry's trigger, which drops its in-flight
sample) and by KV pressure (a path that, in a broken build, drops it too) carries the entry's
evidence, and the whole divergence was filed as known. So before a claimed finding is filed
under its entry, the case runs again without the entry's trigger (KnownUpstream.cause: its
server controls removed, its request fields set neutral, as the shrinker removes things), and
the finding must go away. One that stays is new, reported with both runs: the claimed one and
the one without the trigger. An entry whose trigger the case does not hold (nothing to remove)
or that no case can lose (a configuration, the CPU build's own path) is counted as not tested;
its claim stands as before.

Each judged case keeps its tally (Verdict.claims), which stress sums and prints.
"""
from __future__ import annotations

from harness.search.served.case import ServedCase, clone

TALLY = ("tested", "held", "refuted", "untestable")


def entry(kid: str, version: str | None, runner: str | None = None):
    """The live entry `kid` that claims findings (its trigger, `cause`, is shared by every row's entry
    of that id), or None."""
    from harness.targets.vllm import upstream as vllm_upstream
    from harness.targets.sglang import upstream as sglang_upstream
    for k in vllm_upstream.KNOWN_UPSTREAM + sglang_upstream.KNOWN:
        if k.id == kid and k.codes != vllm_upstream.NEVER and k.live_in(version) and not (
                runner and k.runner and k.runner != runner):
            return k
    return None


def without(case: ServedCase, cause) -> ServedCase | None:
    """`case` without trigger `cause`; None when that removes nothing from it (the case does not
    hold the trigger) or the trigger is a configuration (a served stress runs one per segment)."""
    if not cause or cause.config:
        return None
    c = clone(case)
    changed = False
    if cause.controls:
        kept = [x for x in c.controls if x[1] not in cause.controls]
        changed, c.controls = len(kept) != len(c.controls), kept
    for r in c.requests:
        changed = cause.strip(r) or changed
    return c if changed else None


def stays(f, w) -> object | None:
    """The finding of re-judged verdict `w` (new or claimed) that is `f` again: the same kind about
    the same request (a finding about no request: the same signature); None when it went away."""
    again = list(w.new) + [g for _, g in getattr(w, "claimed", ())]
    for g in again:
        if g.kind != f.kind:
            continue
        if (f.rid and g.rid == f.rid) or (not f.rid and tuple(g.signature) == tuple(f.signature)):
            return g
    return None


def test(rejudge, case: ServedCase, v, version: str | None, runner: str | None = None) -> None:
    """Test each of `v`'s claimed findings (Verdict.claimed: (known id, Finding)) by re-judging
    `case` without its entry's trigger (`rejudge(case) -> Verdict`, the claims of that run not
    tested again): a finding that stays moves from v.known to v.new. v.claims gets the tally."""
    from dataclasses import replace
    tally = dict.fromkeys(TALLY, 0)
    by_kid: dict = {}
    for kid, f in getattr(v, "claimed", ()):
        by_kid.setdefault(kid, []).append(f)
    for kid, fs in by_kid.items():
        k = entry(kid, version, runner)
        bare = without(case, k.cause) if k is not None else None
        w = rejudge(bare) if bare is not None else None
        if w is None or w.refused or any(g.kind in ("crash", "hang", "overlap") for g in w.new):
            tally["untestable"] += len(fs)  # nothing to remove, or its run judged nothing
            continue
        for f in fs:
            tally["tested"] += 1
            g = stays(f, w)
            if g is None:
                tally["held"] += 1
                continue
            tally["refuted"] += 1
            v.known = [(i, what) for i, what in v.known if not (i == kid and what == f.summary)]
            v.claimed = [(i, x) for i, x in v.claimed if x is not f]
            v.new.append(replace(  # the judge's Finding: the claimed run and the one without the trigger
                f, summary=f"{f.summary} (claimed by known upstream {kid}, but it stays without the entry's trigger "
                           f"({k.cause.describe()}): {g.summary}; new)",
                signature=(*f.signature, "claim refuted", kid)))
    v.claims = tally


def line(tally: dict) -> str:
    """The summary's line: the claims tested without their trigger, what became of them."""
    if not any(tally.get(k) for k in TALLY):
        return ""
    return (f"claims tested without their trigger (issue 44): {tally.get('tested', 0)} tested, "
            f"{tally.get('held', 0)} held (the finding went away), {tally.get('refuted', 0)} refuted (new: it stayed), "
            f"{tally.get('untestable', 0)} not tested (the case holds no removable trigger)")
