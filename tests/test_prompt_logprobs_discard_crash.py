"""KNOWN_UPSTREAM async-prompt-logprobs-discard-crash (found by the sweep on 0.16.0, 2026-12-07): a
reset's discarded output keeps its prompt logprobs and the scheduler's assertion kills the async-on
engine, 0.12.0-0.26.x; from 0.27.0 the same drop loses the logprobs (async-prompt-logprobs-dropped-on-reset).
The engine's own run: docs/results/2026-12-07-sweep-stress.md."""
from harness.targets.vllm import releases as vr
from harness.targets.vllm import upstream as vllm_upstream

KID, FACT = "async-prompt-logprobs-discard-crash", "reset_discard_asserts_prompt_logprobs"
LINE = "AssertionError: assert not prompt_logprobs_tensors (scheduler.py:1414)"


def test_its_range_is_the_wheels_source_fact_and_the_drop_entry_starts_where_it_ends():
    k = next(k for k in vllm_upstream.KNOWN_UPSTREAM if k.id == KID)
    drop = next(k for k in vllm_upstream.KNOWN_UPSTREAM if k.id == "async-prompt-logprobs-dropped-on-reset")
    s = vr.FACTS[FACT]
    assert (k.introduced, k.fixed) == (s.since, s.until) == ("0.12.0", "0.27.0")
    assert FACT in vr.SOURCE_CHECKS  # read from every cached wheel (tests/test_vllm_releases.py)
    assert drop.introduced == k.fixed  # one mechanism: fatal before 0.27.0, a silent loss from it
    assert not any(k.live_in(v) and drop.live_in(v) for v in vr.versions())


def test_the_crash_is_named_in_its_range_only_and_async_on_only():
    assert vllm_upstream.known_crash(LINE, True, "0.16.0") == KID
    assert vllm_upstream.known_crash(LINE, True, "0.26.0") == KID
    assert vllm_upstream.known_crash(LINE, True, "0.28.0") == ""  # out of range: a CRASH of its own
    assert vllm_upstream.known_crash(LINE, False, "0.16.0") == ""  # the synchronous scheduler discards nothing
    assert vllm_upstream.known_crash("AssertionError: assert request.num_output_placeholders >= 0 (x.py:1)",
                                     True, "0.16.0") == ""


def test_after_the_death_the_pair_stops_sending_prompt_logprobs():
    trigger, avoid = vllm_upstream.crash_remedy(KID, "0.16.0")
    assert trigger == (("prompt_logprobs", None),) and avoid == ()
    assert vllm_upstream.crash_remedy(KID, "0.32.0") == ((), ())


def test_its_reproducer_resets_while_the_last_prompt_chunk_is_in_flight():
    """The timing, pinned (the stress case the sweep found did not crash in 3 replays: its reset was a
    wall-clock delay): one prompt-logprobs request of C chunks, the output read held back so one step
    ends per hold, and the reset posted once C - 1 steps ended: the engine core takes it after step C
    scheduled the last chunk and before that chunk's output is processed. With the agent's workaround
    of vllm#42043 on (no "stock"), an earlier reset marks nothing, so only the last chunk can crash it."""
    import json
    import math
    from harness.targets.vllm.paths import MAX_BATCHED_TOKENS
    from harness.targets.vllm.workload import RESET
    k = next(k for k in vllm_upstream.KNOWN_UPSTREAM if k.id == KID)
    spec = json.load(open(k.reproducer))
    assert spec["id"] == KID and not spec.get("pair")  # the main pair: its budget is MAX_BATCHED_TOKENS
    (req,) = spec["requests"]
    assert req["prompt_logprobs"] and req["temperature"] == 0.0
    chunks = math.ceil(len(req["prompt"]) / MAX_BATCHED_TOKENS)
    assert chunks >= 3  # a reset one step early or late lands on a partial chunk or the first decode
    (ctl,) = spec["controls"]
    assert ctl["post"] == RESET and ctl["after_steps"] == chunks - 1
    assert spec["plan"]["delays"]["before_wait"]["ms"] >= 300 and "stock" not in spec["plan"]
