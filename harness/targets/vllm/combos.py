"""vLLM's path features, attacked two at a time (issue 44, item 2; the ref engine's are
harness.workloads.combos, whose rule this follows).

FEATURES are mechanisms of vLLM's async path a request can take; a strength-2 covering array
(harness.workloads.covering) over them plans a few request mixes, each row's features turned on
for the same requests (the "featured" ones), one run per row and arm (the agent's books at idle
are then the row's). What met is read back from the agent's per-request counts and the answers (`observed`),
never from the plan: a pair the plan put together that no request exercised is `not exercised`.
A books finding at idle is named by its pair: the pairs every failing row turns on and no clean
row does (`suspects`), each run again in a row with only its two features on.
"""
from __future__ import annotations

import itertools
import random

from harness.engine.request import Request
from harness.workloads.covering import CoveringArray, on_off_plan, planned_pairs  # noqa: F401 (planned_pairs: this module's API too)

FEATURES = {
    "abort": "the client disconnected after its first tokens and the abort reached the scheduler (finish "
             "FINISHED_ABORTED in the agent's books)",
    "prefix_hit": "its first step started past blocks another request cached (the books' prefix_hit)",
    "preempt_in_flight": "preempted with a step of it in flight: a /reset_prefix_cache with running requests "
                         "(the books' preempted_in_flight)",
    "chunked_prefill": "its first step ended before its prompt did (the books' prefill_chunk)",
    "structured_output": "a regex constrained the tokens it produced",
    "prompt_logprobs": "asked for prompt logprobs and was answered",
    "penalty": "a frequency penalty applied to the tokens it produced",
    "seed": "seeded sampling (temperature > 0) produced its tokens",
}
# the path rows (harness.targets.vllm.paths.PATHS) whose mechanism each feature takes: a feature
# whose row the release, runner or configuration lacks (target.row_absent) leaves the plan, its
# pairs n/a (equivalence/test_path_pairs.py)
PATH_ROWS = {
    "abort": ("abort",),
    "prefix_hit": ("prefix_cache_hit",),
    "preempt_in_flight": ("prefix_cache_reset", "preemption_in_flight"),
    "chunked_prefill": ("chunked_prefill",),
    "structured_output": ("structured_output",),
    "prompt_logprobs": ("logprobs",),
    "penalty": ("penalties",),
    "seed": ("seeded_reorder",),
}
# pairs no request can hold here: the client's disconnect reads a stream, and vLLM's server refuses
# prompt logprobs on a stream (HTTP 400 "`prompt_logprobs` are not available when `stream=True`",
# measured on 0.32.0); a request that asks for prompt logprobs never reads the prefix cache
# (SamplingParams sets skip_reading_prefix_cache: a cached prefix has no logprobs to give; measured:
# the first served run met prefix_hit in no request of the row that held both, 0 of 6)
EXCLUSIVE: dict = {
    frozenset(("abort", "prompt_logprobs")): "a client disconnect needs a stream, and vLLM refuses prompt "
                                             "logprobs with stream=True",
    frozenset(("prefix_hit", "prompt_logprobs")): "vLLM skips reading the prefix cache for a request that "
                                                  "asks for prompt logprobs (skip_reading_prefix_cache)",
}
FEATURED = 3  # requests per row that carry its features
# tokens a featured request of an abort row reads before its client disconnects: enough that a
# row's reset finds it running
ABORT_AFTER = 10
MAX_TOKENS = 32
WARM_STEPS = 10  # a prefix row's featured requests arrive this many arrival units after its warm-up
# a preemption row's resets, seconds after its featured requests arrive. One at 0.15 s found no
# request decoding in the row whose requests also prefill in chunks and compile a grammar (measured:
# preempt_in_flight x seed / structured_output / prefix_hit not met in the first gate run); a reset
# preempts with a step in flight only a request that decodes, so a few spread over its first second
RESET_AFTER_S = (0.15, 0.45, 0.9)
# a grammar that runs past ABORT_AFTER tokens and past the row's reset: 12 to 16 short words
REGEX = "( [a-z]{2,6}){12,16}[.]"


def plan(features=tuple(FEATURES)) -> CoveringArray:
    """The rows: every pair of feature values (on/off) meets in one of them (workloads.covering)."""
    return on_off_plan(features, EXCLUSIVE)



def mix(tok, row: dict, i: int, seed: int = 0) -> tuple[list[Request], list]:
    """Row `i`'s requests (rids `r<i>c<k>`, and `r<i>w`, a warm-up that caches the row's own prefix
    first where the row asks for hits) and its controls: a /reset_prefix_cache while its featured
    requests run, where it asks for preemption in flight (after their prefix hits: a reset empties
    the prefix cache). One run per row and arm: the agent's books at idle are then the row's."""
    from harness.targets.vllm.paths import MAX_BATCHED_TOKENS
    from harness.targets.vllm.workload import PREFIX, token_ids
    from harness.workloads.presets import WORDS
    rng = random.Random(seed * 1000 + i)
    on = {f for f, v in row.items() if v}
    reqs = []
    head = token_ids(tok, f"Row {i}. " + PREFIX) if "prefix_hit" in on else []
    late = 0
    if head:
        reqs.append(Request(f"r{i}w", head + token_ids(tok, " warm"), max_new_tokens=2))
        late = WARM_STEPS  # its prefill processed (its blocks cached) first, async on or off
    for c in range(FEATURED):
        n = MAX_BATCHED_TOKENS + 24 if "chunked_prefill" in on else 6
        words = token_ids(tok, f" {i}{c} " + " ".join(rng.choice(WORDS) for _ in range(n)))
        if "chunked_prefill" not in on:
            words = words[:12]  # well inside one step's budget
        r = Request(f"r{i}c{c}", head + words, max_new_tokens=MAX_TOKENS, arrival=late, ignore_eos=True)
        r.extra = {}
        if "abort" in on:
            r.abort_after = ABORT_AFTER
        if "structured_output" in on:
            r.extra["structured_outputs"] = {"regex": REGEX}
            r.ignore_eos = False  # the grammar ends it
        if "prompt_logprobs" in on:
            r.extra["prompt_logprobs"] = 1
        if "penalty" in on:
            r.extra["frequency_penalty"] = 0.5
        if "seed" in on:
            r.temperature, r.top_p, r.seed = 0.8, 0.95, rng.randrange(1 << 30)
        reqs.append(r)
    from harness.targets.served.pair import ARRIVAL_MS
    controls = [(late * ARRIVAL_MS / 1000.0 + s, "reset") for s in RESET_AFTER_S] if "preempt_in_flight" in on else []
    return reqs, controls


def row_of(rid: str) -> int | None:
    return int(rid[1:].split("c")[0]) if rid.startswith("r") and "c" in rid else None


def observed(r: Request, books, out_ids) -> frozenset[str]:
    """The features one request's path took in one arm: the agent's books (harness.oracles.steps
    StepBooks of that arm) and its answer's token ids (None: no answer)."""
    from harness.agents.vllm.steps import request_key
    key = request_key(r.prompt_ids, r.max_new_tokens)
    ev = books.evidence.get(key, {})
    got = bool(out_ids)
    ex = getattr(r, "extra", None) or {}
    seen = {
        "abort": any("ABORT" in f for f in books.finish.get(key, ())),
        "prefix_hit": ev.get("prefix_hit", 0) > 0,
        "preempt_in_flight": ev.get("preempted_in_flight", 0) > 0,
        "chunked_prefill": ev.get("prefill_chunk", 0) > 0,
        "structured_output": bool(ex.get("structured_outputs")) and got,
        "prompt_logprobs": bool(ex.get("prompt_logprobs")) and got,
        "penalty": bool(ex.get("frequency_penalty")) and got,
        "seed": r.temperature > 0 and r.seed is not None and got,
    }
    return frozenset(f for f, v in seen.items() if v)


def met(features) -> set[tuple[str, str]]:
    order = list(FEATURES)
    return set(itertools.combinations(sorted(features, key=order.index), 2))


def count_pairs(reqs, arms: dict) -> dict[tuple[str, str], list[int]]:
    """pair -> [requests that met it async on, async off]; `arms`: overlap -> (StepBooks, {rid: ids})."""
    out: dict = {}
    for k, overlap in enumerate((True, False)):
        books, ids = arms[overlap]
        for r in reqs:
            if row_of(r.rid) is None:
                continue  # a warm-up request
            for p in met(observed(r, books, ids.get(r.rid))):
                out.setdefault(p, [0, 0])[k] += 1
    return out


def pair_name(pair) -> str:
    return " x ".join(pair)


def suspects(arr: CoveringArray, failing: list[int], clean: list[int]) -> list[tuple[str, str]]:
    """The planned pairs every failing row turns on and no clean row does: what the books finding is
    named by."""
    def on(i):
        return {p for p in itertools.combinations(arr.factors, 2) if arr.rows[i][p[0]] and arr.rows[i][p[1]]}
    if not failing:
        return []
    common = set.intersection(*(on(i) for i in failing))
    return sorted(common - set().union(*(on(i) for i in clean)) if clean else common)
