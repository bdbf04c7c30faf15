"""The ref engine's path features, attacked two at a time (issue 44, item 2).

FEATURES are the mechanisms a request's path can take in the ref engine; LACKING the ones other
engines have and this one does not (n/a here). A strength-2 covering array (covering.py) over
FEATURES plans a few request mixes; `mix` turns a row into requests and engine settings in which
the row's features are on for the same requests (the "featured" ones), so a pair on together in a
row meets on one request. What met is read back from the engine's own counts (`observed`), never
from the plan: a pair the plan put together that no request exercised is `not exercised`.
"""
from __future__ import annotations

import itertools
import random

from harness.engine.request import Request
from harness.workloads.covering import CoveringArray, on_off_plan, planned_pairs  # noqa: F401 (planned_pairs: this module's API too)
from harness.workloads.presets import SYSTEM, WORDS

# feature -> what the engine's counts show for one request (the rule for "it ran")
FEATURES = {
    "abort": "the client aborted it while running (Engine.abort; Request.aborted), so it ended after its step in "
             "flight (finish reason abort)",
    "prefix_hit": "its prompt found another request's cached pages at its first admission (Request.hit_pages)",
    "retraction": "retracted at least once with a step in flight, then readmitted (Request.retractions)",
    "sampling": "seeded sampling (temperature > 0) produced a token",
    "penalty": "a repetition penalty applied to a token it produced",
    "stop": "a stop string (or EOS) ended it at a step's result (finish reason stop)",
    "spec": "speculative decoding (the oracle drafter) verified a window of it (spec.accept_by_rid)",
}
LACKING = {
    "chunked_prefill": "a prompt is prefilled in one step; one over --max-prefill-tokens is refused",
    "structured_output": "no grammar or structured output",
    "prompt_logprobs": "only the sampled tokens' log-probabilities",
    "reset_pause": "no prefix-cache reset and no pause",
}
# pairs no request can hold: the engine refuses it, or a request ends once
EXCLUSIVE = {
    frozenset(("spec", "penalty")): "the engine refuses a repetition penalty with speculative decoding",
    frozenset(("abort", "stop")): "a request ends once: by its abort or by its stop string",
}
FEATURED = 4  # requests per mix that carry the row's features
# a featured request's first byte, distinct per request, so no prompt shares a page with
# another unless the row asks for a prefix hit
LEADS = "ABCD"
SPEC_K = 3
RETRACT_AT = 2  # tokens a request of a retraction row has when it is retracted
ABORT_AT = 4  # tokens (or one more) a request of an abort row has when the client aborts it


def _ids(tok, text: str) -> list[int]:
    return [tok.bos_id] + tok.encode(text) if getattr(tok, "add_bos", False) else tok.encode(text)


def plan(features=tuple(FEATURES)) -> CoveringArray:
    """The rows: every pair of feature values (on/off) meets in one of them (workloads.covering)."""
    return on_off_plan(features, EXCLUSIVE)



def mix(tok, row: dict, seed: int = 0) -> tuple[list[Request], dict, dict]:
    """The requests, engine settings and client plan of one row: FEATURED requests carry every
    feature the row turns on; a warm-up request caches the shared prefix first when prefix_hit
    is on. The plan ({"retract": {rid: n}, "abort": {rid: n}}: the tokens a request has when
    `drive` retracts or aborts it) is for `drive`, the run's on_step hook."""
    rng = random.Random(seed)
    on = {f for f, v in row.items() if v}
    reqs, kw = [], dict(max_running=FEATURED, page_size=2)
    late = 0
    if "prefix_hit" in on:
        reqs.append(Request("warm", _ids(tok, SYSTEM + "warm"), max_new_tokens=2))
        late = 4  # its prefill has been processed (its pages cached) by then, overlap on or off
    retract, abort = {}, {}
    for i in range(FEATURED):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))
        text = (SYSTEM + f"{LEADS[i]} {words}") if "prefix_hit" in on else f"{LEADS[i]} {words}"
        r = Request(f"c{i}", _ids(tok, text), max_new_tokens=24, arrival=late, ignore_eos=True)
        if "abort" in on:  # the client's abort, as the server's disconnect calls it (Engine.abort)
            abort[r.rid] = ABORT_AT + i % 2
        if "sampling" in on:
            r.temperature, r.top_p, r.seed = 0.8, 0.9, rng.randrange(1 << 30)
        if "penalty" in on:
            r.repetition_penalty = 1.3
        if "stop" in on:
            r.stop, r.ignore_eos = tuple("0123456789"), False
        if "retraction" in on:
            retract[r.rid] = RETRACT_AT
        reqs.append(r)
    if "spec" in on:
        kw.update(spec="oracle", spec_k=SPEC_K, spec_wrong=0.2)
    return reqs, kw, {"retract": retract, "abort": abort}


def drive(plan: dict):
    """An on_step hook, between two rounds of the loop: the client aborts each planned running
    request once it has its tokens (Engine.abort, as the server's disconnect does), and each
    planned request is retracted once it has its tokens, which is where the scheduler's own
    retraction runs (the start of the next prepare): under overlap the step just launched with
    it is in flight. The scheduler retracts
    only when the pool runs dry, and then the request with the fewest tokens: a pool sized so
    that the featured requests are the victims misses them whenever the model's outputs change
    (measured: one victim of four, in two rows of three)."""
    never = 1 << 30

    def hook(eng):
        for r in list(eng.sched.running):
            if not r.aborted and len(r.output_ids) >= plan["abort"].get(r.rid, never):
                eng.abort(r)
            elif r.retractions == 0 and not r.aborted and len(r.output_ids) >= plan["retract"].get(r.rid, never):
                eng.sched.retract(r)
    return hook


def observed(eng, r: Request) -> frozenset[str]:
    """The features one request's path took, from the engine's own counts."""
    got = bool(r.output_ids)
    seen = {
        "abort": r.aborted and r.finish_reason == "abort",
        "prefix_hit": r.hit_pages > 0,
        "retraction": r.retractions > 0,
        "sampling": r.temperature > 0 and got,
        "penalty": r.repetition_penalty != 1.0 and got,
        "stop": r.finish_reason == "stop",
        "spec": eng.spec is not None and r.rid in eng.spec.accept_by_rid,
    }
    return frozenset(f for f, v in seen.items() if v)


def met(features: frozenset[str]) -> set[tuple[str, str]]:
    """The pairs one request met, in FEATURES order."""
    order = list(FEATURES)
    return set(itertools.combinations(sorted(features, key=order.index), 2))


def pair_name(pair) -> str:
    return " x ".join(pair)
