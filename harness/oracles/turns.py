"""Multi-turn chat judged turn by turn (issue 36, item 2).

A conversation's turn k+1 is sent with the arm's own answer of turn k appended
(harness.targets.served.chat_turns), so once the arms' answers differ at turn k, the later turns have
different prompts and nothing to be compared by: a difference there is the earlier one's echo,
and an agreement there proves nothing. `comparable` keeps each conversation's turns up to and
including the first one whose ids or finish reason differ between the arms (the token oracles
judge that turn: a clear winner is a divergence, a near tie is rounding) and leaves the rest out of
every oracle, saying how many; a conversation that one arm ended early (a turn the engine failed)
is cut where the shorter one ends.

Within the kept turns every oracle judges each turn as a request of its own: the token oracles
(ids, records), the surface oracle (finish and stop reason, usage against the template's prompt
length, text), and the steps oracle (`as_requests`: each turn's prompt ids as the client sent
them, by which the agent keys its books).
"""
from __future__ import annotations

import copy

from harness.targets.served.chat_turns import split_turn


def conversations(run) -> dict[str, list[tuple[int, str]]]:
    """rid -> [(turn, output rid)] in turn order, for every conversation in a run."""
    out: dict[str, list] = {}
    for rid, *_ in run.outputs:
        head, k = split_turn(rid)
        if k is not None:
            out.setdefault(head, []).append((k, rid))
    return {h: sorted(v) for h, v in out.items()}


def comparable(off, on) -> tuple[object, object, dict]:
    """(off, on, counts): copies of both runs without the turns that follow the arms' first
    difference in their conversation; counts: conversations, turns kept (per arm), turns left
    out (both arms), and per conversation the turn after which it was cut."""
    ids = {lab: {rid: (list(i), f) for rid, i, f in run.outputs} for lab, run in (("off", off), ("on", on))}
    conv_off, conv_on = conversations(off), conversations(on)
    drop: set[str] = set()
    counts = {"conversations": len(set(conv_off) | set(conv_on)), "turns": 0, "left_out": 0, "cut": {}}
    for head in sorted(set(conv_off) | set(conv_on)):
        a, b = conv_off.get(head, []), conv_on.get(head, [])
        n = min(len(a), len(b))
        last = n  # the last turn kept (1-based): the first that differs, or the last both have
        for i in range(n):
            if ids["off"][a[i][1]] != ids["on"][b[i][1]]:
                last = i + 1
                break
        for _, rid in a[last:] + b[last:]:
            drop.add(rid)
        counts["turns"] += last
        left = len(a) - last + len(b) - last
        counts["left_out"] += left
        if left:
            counts["cut"][head] = last
    return _without(off, drop), _without(on, drop), counts


def _without(run, drop: set):
    if not drop:
        return run
    r = copy.copy(run)
    r.outputs = [o for o in run.outputs if o[0] not in drop]
    if hasattr(run, "logprobs"):
        r.logprobs = {k: v for k, v in run.logprobs.items() if k not in drop}
    if hasattr(run, "surface"):
        r.surface = {k: v for k, v in (run.surface or {}).items() if k not in drop}
    return r


def as_requests(reqs, run) -> list:
    """Each kept turn as a request with the prompt ids the client sent (the steps oracle keys the
    agent's books by prompt ids and max_tokens); turns whose prompt ids are unknown (a tokenizer
    without a chat template) are left out."""
    by_rid = {r.rid: r for r in reqs}
    out = []
    for head, turns in conversations(run).items():
        r = by_rid.get(head)
        for _, rid in turns:
            sent = ((getattr(run, "surface", None) or {}).get(rid) or {}).get("prompt_ids")
            if r is None or sent is None:
                continue
            c = copy.copy(r)
            c.rid, c.prompt_ids = rid, list(sent)
            out.append(c)
    return out


def line(counts: dict) -> str:
    """What the run had to judge (a turn left out is no pass: said with its conversation)."""
    cut = ", ".join(f"{h} after turn {k}" for h, k in sorted(counts.get("cut", {}).items()))
    return (f"chat: {counts.get('conversations', 0)} conversation(s), {counts.get('turns', 0)} turn(s) judged"
            + (f"; {counts['left_out']} later turn(s) not comparable (the arms' answers differed earlier"
               + (f": {cut})" if cut else ")") if counts.get("left_out") else ""))
