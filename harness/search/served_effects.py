"""A drawn parameter must have had an effect (issue 36, item 3) in the served search.

`allowed_token_ids` (both vLLM APIs: the engine masks every other token, a batch-level logits
processor whose rows follow the requests as they join and leave the batch under async) is drawn on
about one request in twelve (a hash of the request as drawn: see served_case on drawn coins), with
the ids of 4-8 of the workload's words: a request that may only say them runs to its max_tokens.
A mask that allows what the model would say anyway changes nothing, and then a bug on its path
has nothing to corrupt: so each request that sets it is sent once more to the async-off server
without it (one run after the case, harness.oracles.effects.without), and the search counts the
requests whose answer it changed; the summary marks the parameter `not exercised` when it changed
none (never a pass).

Left out, with why (they do not reach the async path: vLLM applies them in its API layer before
the engine sees the request): `echo` (the prompt returned with the answer: with token ids its
logprobs would carry the prompt's ids), `truncate_prompt_tokens` (the prompt cut when tokenized).
"""
from __future__ import annotations

import zlib

from hypothesis import strategies as st

EFFECT_PARAMS = ("allowed_token_ids",)
COIN = 12


# what could leave such a request no token at all (a grammar none of its words starts, a processor
# that bans each word once said): a request the server cannot answer, in both arms (measured: a
# regex " (yes|no)" with 8 allowed words ended its stream without usage, async off too)
CONFLICTS = ("chat", "structured_outputs", "vllm_xargs")


def maybe_allowed_ids(draw, tok, r) -> None:
    """One request in COIN (none with a CONFLICTS field) may say only a few of the workload's words."""
    from harness.targets.vllm.workload import WORDS
    if any(r.extra.get(k) for k in CONFLICTS) or zlib.crc32(repr(r).encode()) % COIN:
        return
    words = draw(st.lists(st.sampled_from(WORDS), min_size=4, max_size=8, unique=True))
    r.extra["allowed_token_ids"] = sorted({tok.encode(" " + w)[-1] for w in words})


def copies(case, cut=()) -> list:
    """The case's requests that set a parameter of EFFECT_PARAMS, each without it; clients that
    leave, and answers a pause cut (`cut`), are left out (their outputs are cut)."""
    from harness.oracles.effects import without
    return [without(r, p) for r in case.requests for p in EFFECT_PARAMS
            if p in (r.extra or {}) and r.abort_after is None and r.rid not in cut and not r.extra.get("chat")]


def check(target, case, off_run, cut=()) -> dict:
    """(rid, param) -> the parameter changed the request's async-off answer (one run more)."""
    from harness.oracles.effects import effects
    cs = copies(case, cut)
    if not cs:
        return {}
    for c in cs:  # an unseeded sampled request draws its seed from its rid (ServedTarget.payload): keep the original's
        if c.temperature > 0 and c.seed is None:
            c.seed = (zlib.crc32(c.rid.split("~")[0].encode()) ^ getattr(target, "seed", 0)) & 0x7FFFFFFF
    return effects(off_run, target.run(cs, overlap=False))


def line(counts: dict) -> list[str]:
    """counts: param -> [requests it changed, requests that set it] over the search."""
    out = []
    for p, (changed, n) in sorted(counts.items()):
        out.append(f"effects (async off, the same request without it): {p} changed {changed} of {n} request(s)"
                   + ("   <- not exercised" if n and not changed else ""))
    return out
