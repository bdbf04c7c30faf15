"""Requests a server aborted by `/pause?mode=abort` (issue 36, item 2: the pause modes other than
`keep`), judged by what they still promise.

vLLM 0.32's abort pause (vllm/v1/engine/core.py, `pause_scheduler`) finishes every request in the
scheduler as FINISHED_ABORTED and sends their outputs: each client gets the tokens generated so
far, finish `abort`. The two arms reach the pause at different points of their requests (async
runs a step ahead), so how many tokens an aborted request got is timing, not a bug. What is not
timing: those tokens are the request's own, so an arm's cut answer is a prefix of the other arm's
answer (both cut: the shorter a prefix of the longer). `comparable` cuts both arms' answers of
every request either arm reports aborted (or whose stream ended with no finish reason: vLLM's
completions stream skips an empty chunk of a request with no token yet, its terminal `abort` one
too, measured on stock 0.32.0, both arms; the same skip on /inference/v1/generate is
vllm-project/vllm#47933), or whose client meant to leave at k tokens and got fewer
in an arm (its stream records no server finish), to their common length and leaves their other fields out (usage and text of a cut answer are the cut's),
so the token oracles judge exactly the prefix property: a clear-winner difference inside the
common length is a divergence like any other. Requests after the resume run whole and are judged
whole.
"""
from __future__ import annotations

import copy

ABORT = "abort"


def comparable(case, off, on) -> tuple[object, object, set]:
    """(off, on, rids): both runs with every server-aborted answer cut to the arms' common length,
    and the rids cut (no pause_abort in the case: the runs unchanged)."""
    if not any(what == "pause_abort" for _, what in case.controls):
        return off, on, set()
    by_rid = {r.rid: r for r in case.requests}
    fin = {lab: {rid: (list(i), f) for rid, i, f in run.outputs} for lab, run in (("off", off), ("on", on))}
    cut: dict[str, int] = {}
    for rid, (a, fa) in fin["off"].items():
        if rid not in fin["on"]:
            continue
        b, fb = fin["on"][rid]
        r = by_rid.get(rid.split("#")[0].split("@")[0])
        if r is None:
            continue
        # a client that disconnects at k tokens reads a stream and records no server finish: the pause
        # cut it when an arm's answer ended before k (the first 20-minute stress of the final build
        # filed such an answer, 7 of 9 tokens, as a divergence)
        left = getattr(r, "abort_after", None)
        if (min(len(a), len(b)) >= left) if left is not None else not {ABORT, None} & {fa, fb}:
            continue  # the client left on its own in both arms, or the pause cut neither
        cut[rid] = min(len(a), len(b))
    return _cut(off, cut), _cut(on, cut), set(cut)


def _cut(run, cut: dict):
    if not cut:
        return run
    r = copy.copy(run)
    r.outputs = [(rid, list(ids)[:cut[rid]], ABORT) if rid in cut else (rid, ids, f) for rid, ids, f in run.outputs]
    if hasattr(run, "logprobs"):
        r.logprobs = {k: (list(v)[:cut[k]] if k in cut else v) for k, v in run.logprobs.items()}
    if hasattr(run, "surface"):
        r.surface = {k: v for k, v in (run.surface or {}).items() if k not in cut}
    return r
