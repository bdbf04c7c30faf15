"""Every parameter must have had an effect (issue 36, item 3).

A row that sets a sampling parameter and passes says nothing when the parameter changed nothing:
a penalty too weak to move the greedy choice, a bad word the model would never say, a logit bias
on a token that wins anyway. Then a bug on that parameter's path has nothing to corrupt. So each
request that sets one is sent again to the async-off server without it (one copy per parameter,
all in one run after the workload), and its output must differ from the request's own async-off
output; a row whose parameter changed no output of any of its requests is `not exercised`, never a
pass.

Judged in the async-off arm (stock, synchronous): the question is whether the workload exercises
the parameter, not whether the async path is right. A difference caused by the copy's other batch
(float32 rounding at a near-tie) would pass a parameter wrongly; the greedy prompts here are far
from ties in practice, and `effects_line` prints every figure.
"""
from __future__ import annotations

import copy

# the parameters each row exists to exercise: request attributes (Request) or body fields (r.extra)
ROW_PARAMS = {
    "penalties": ("repetition_penalty", "presence_penalty", "frequency_penalty"),
    "bad_words": ("bad_words",),
    "min_tokens": ("min_tokens",),
    "logit_bias": ("logit_bias",),
    "stop": ("stop", "stop_token_ids"),
    "logits_processor_cli": ("vllm_xargs",),
    "logits_processor_cli_value": ("vllm_xargs",),
    "logits_processor_batch_cli": ("vllm_xargs",),
    "logits_processor_entry_point": ("vllm_xargs",),
    "logits_processor_batch_entry_point": ("vllm_xargs",),
    "structured_output": ("structured_outputs",),
}
_NEUTRAL = {"repetition_penalty": 1.0, "stop": ()}  # a Request attribute's value when not set


def sets(r, param: str) -> bool:
    if param in _NEUTRAL and getattr(r, param, _NEUTRAL[param]) != _NEUTRAL[param]:
        return True
    return param in (getattr(r, "extra", None) or {})


def without(r, param: str):
    """A copy of request `r` without `param` (its own rid: `<rid>~no-<param>`)."""
    c = copy.copy(r)
    c.rid = f"{r.rid}~no-{param}"
    c.output_ids, c.output_logprobs = [], []
    if param in _NEUTRAL:
        setattr(c, param, _NEUTRAL[param])
    c.extra = {k: v for k, v in (getattr(r, "extra", None) or {}).items() if k != param}
    return c


def copies(reqs) -> list:
    """One copy per (request, parameter of one of its rows) that the request sets; aborted clients
    are left out (their outputs are cut by the client)."""
    out, seen = [], set()
    for r in reqs:
        if getattr(r, "abort_after", None) is not None:
            continue
        for row in sorted(getattr(r, "paths", ())):
            for p in ROW_PARAMS.get(row, ()):
                if sets(r, p) and (r.rid, p) not in seen:
                    seen.add((r.rid, p))
                    out.append(without(r, p))
    return out


def effects(off_run, copies_run) -> dict:
    """(rid, param) -> whether the request's async-off output differs from its copy's without
    the parameter (by the tokens of every sample: n > 1 twins by their '#k' suffix)."""
    base = {rid: list(ids) for rid, ids, *_ in off_run.outputs}
    out = {}
    for rid, ids, *_ in copies_run.outputs:
        head, _, k = rid.partition("#")
        orig, _, param = head.partition("~no-")
        key = orig + (f"#{k}" if k else "")
        if key in base:
            out[(orig, param)] = out.get((orig, param), False) or list(ids) != base[key]
    return out


def row_verdict(row: str, reqs, eff: dict) -> tuple[bool | None, str]:
    """(exercised, line) for one row: None when the row sets none of its parameters (nothing to
    judge); False when some parameter of the row changed no output of any of its requests."""
    params = ROW_PARAMS.get(row)
    if not params:
        return None, ""
    mine = [r for r in reqs if row in getattr(r, "paths", ()) and getattr(r, "abort_after", None) is None]
    figs, dead = [], []
    for p in params:
        setters = [r.rid for r in mine if sets(r, p)]
        if not setters:
            continue
        changed = [rid for rid in setters if eff.get((rid, p))]
        figs.append(f"{p} {len(changed)}/{len(setters)}")
        if not changed:
            dead.append(f"{p} changed no output of {', '.join(setters)} (async off, the same request without it)")
    if not figs:
        return None, ""
    line = f"effects on {row}: " + ", ".join(figs) + " requests changed by the parameter"
    if dead:
        return False, f"not exercised: {row}: " + "; ".join(dead)
    return True, line
