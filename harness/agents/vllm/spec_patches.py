"""Speculative decoding's bugs with a frame in flight (issue 43, item 3), re-created as source
patches of vLLM (data: the registry in harness.agents.vllm.patches builds them).

vllm#46066: under async scheduling with drafts, `reset_prefix_cache(reset_running_requests=True)`
preempts every running request (drop mode: the frame in flight is stale and is to be thrown away,
because the request is resumed in the very next schedule, before that frame returns). Before the
fix, `Scheduler.update_from_output` applied the stale frame's rejection count (its drafts
rejected) before the discard: to the resumed request's fresh num_computed_tokens and output
placeholders. The placeholders go negative (the `> 0` guard checks the value, not the
subtraction), num_computed_tokens runs behind what was computed. vLLM 0.32.0 discards a drop-mode
frame before the rollback, and skips the rollback for any stale frame (`if not output_is_stale`).
The patch puts the discard back after the rollback, for the drop-mode frame only (a deliver-mode
stale frame, a KV-pressure preemption's, keeps 0.32.0's guard: see DELIVER_MODE_UNREACHABLE).

Reached by the `spec_reset_in_flight` row (its own run, before the workload: short penalized
greedy requests under five resets, so a stale frame of rejected drafts returns to a request resumed
whole in the schedule right after the reset; the agent counts that shape, `spec_stale_drop_resumed`).
What shows, measured on 0.32.0 here (2026-12-07): the rollback lowers num_computed_tokens and the
placeholders by the same count, and schedule() uses only their difference, so the schedule and the
tokens are unchanged; the placeholders are below 0 right after that update (the agent's
`placeholders_below_zero`, checked after every update: the row's violation), and vLLM's own
`assert request.num_output_placeholders >= 0` (at a token's delivery) fires only where no later
step's placeholders were added first: in a probe of 3 requests under 4 resets the shape came twice
and the engine lived with equal tokens; in the gate's workload it killed the engine once.
"""
from __future__ import annotations

PATHS_SUITE = "test_paths"
SCHED = "v1/core/sched/scheduler.py"

SPECS: list[dict] = [dict(zip(("name", "description", "path", "suite", "file", "search", "replace", "upstream",
                               "also"), s)) for s in [
    (
        "spec_reset_rolls_back_stale_rejections",
        "a prefix-cache reset with a speculative frame in flight (drop mode: the request resumes in the next "
        "schedule) applies the stale frame's rejected drafts to the resumed request before discarding the "
        "frame: its num_computed_tokens and its output placeholders fall behind what is in flight, the "
        "placeholders below 0 (vLLM's assertion at the next delivery fires unless a later step's "
        "placeholders came first)",
        "spec_reset_in_flight", PATHS_SUITE, SCHED,
        "            # Drop-mode stale output (same-step resume) is discarded entirely.\n"
        "            if output_is_stale and request.drop_stale_output:\n"
        "                continue\n",
        "            # (vllm#46066 re-created: the drop-mode discard comes after the rejection rollback)\n",
        ("vllm-project/vllm#46066", "vllm-project/vllm#49620"),
        (("                if not output_is_stale:\n"
          "                    if request.num_computed_tokens > 0:\n",
          "                if not output_is_stale or request.drop_stale_output:\n"
          "                    if request.num_computed_tokens > 0:\n"),
         ("            # Free encoder inputs only after the step has actually executed.\n",
          "            if output_is_stale and request.drop_stale_output:\n"
          "                continue\n"
          "            # Free encoder inputs only after the step has actually executed.\n"))),
]]

# the configuration each patch needs (harness.targets.vllm.configs): drafts in every step's frame
CONFIG = {"spec_reset_rolls_back_stale_rejections": "spec-draft"}

# why the gate does not show a patch caught on 0.32.0 here (printed by `check --fault`, listed by
# `mutants`): none now. spec_reset_rolls_back_stale_rejections was listed until the spec_reset_in_flight
# row: the workload's one reset found only long requests running, resumed in chunks (no placeholder
# held when the stale frame returns), so the rollback changed nothing visible there
UNREACHABLE: dict[str, str] = {}

# the release a patch's text has its shape from (read from every cached wheel): the drop-mode
# discard, the stale guard and the encoder-free comment together from 0.27.0
SINCE = {"spec_reset_rolls_back_stale_rejections": "0.27.0"}

# the deliver-mode twin (a KV-pressure preemption with a speculative frame in flight, vllm#48245's
# class) is not a patch here: why, from 0.32.0's code, for the report and the docs
DELIVER_MODE_UNREACHABLE = (
    "a KV-pressure preemption with a speculative frame in flight (deliver mode) cannot meet a resumed "
    "request on vLLM 0.32.0 without pipeline parallelism: _preempt_request zeroes num_computed_tokens and "
    "num_output_placeholders, and schedule() skips a waiting request while it has deliverable stale output "
    "(`request.num_stale_output_tokens and not request.drop_stale_output`: 'resuming now could resample a "
    "position that output later delivers'), so when the stale frame's update runs both counts are still 0 "
    "and a rollback applied there (the guard `if not output_is_stale` removed) changes nothing; at async "
    "depth 1 (one step in flight, both runners) no second frame exists to drain later. The same scheduler "
    "serves V1 and V2 (ngram_gpu included)")
