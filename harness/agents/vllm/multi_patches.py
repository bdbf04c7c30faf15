"""Bugs beyond one worker (issue 45), re-created as source patches of vLLM (data: the registry in
harness.agents.vllm.patches builds them). Each lives where tensor or pipeline parallelism takes
vLLM: a rank of its own, more than one step in flight, the decode stagger of pipeline stages,
V1's refusal of PP with async scheduling. They run in the multi-worker configurations
(harness.targets.vllm.configs: tp2, pp2, pp3-v1; CONFIG names which); on one worker some are the
stock code's twin (a rank 1 that does not exist, a second frame never in flight) and that is the
point of the pairs: stock and one worker stay quiet, the configuration that reaches the bug does not.
"""
from __future__ import annotations

PATHS_SUITE = "test_paths"
RUNNER = "v1/worker/gpu_model_runner.py"
SCHED = "v1/core/sched/scheduler.py"
ASYNC_SCHED = "v1/core/sched/async_scheduler.py"
CONFIG_PY = "config/vllm.py"

SPECS: list[dict] = [dict(zip(("name", "description", "path", "suite", "file", "search", "replace", "upstream"), s))
                     for s in [
    (
        "rank_keeps_finished_state",
        "every worker but rank 0 keeps a finished request's state (the runner's requests map): rank 0's "
        "books are clean at idle, rank 1's hold one request state per request served. A leak of one "
        "rank is judged only where every rank's books are read (before issue 45 the target kept the "
        "last worker file it read)", "stop", PATHS_SUITE, RUNNER,
        "            req_state = self.requests.pop(req_id, None)\n"
        "            self._on_request_state_removed(req_id, req_state)\n",
        "            req_state = (self.requests.pop(req_id, None) if self.parallel_config.rank == 0\n"
        "                         else self.requests.get(req_id))\n"
        "            self._on_request_state_removed(req_id, req_state)\n",
        ("vllm-project/vllm#30142",)),
    (
        "pp_decode_no_stagger",
        "async scheduling with pipeline parallelism schedules a decode again in the very next step, "
        "not pipeline size steps later: two tokens of one request are in flight together and the "
        "second step reads a last-sampled id the last stage has not broadcast yet (V2's sampled-token "
        "ring has pipeline size slots), so the request's next input is stale: wrong tokens",
        "penalties", PATHS_SUITE, ASYNC_SCHED,
        "        self.decode_stagger = self.pp_size\n",
        "        self.decode_stagger = 1\n",
        ("vllm-project/vllm#32359", "vllm-project/vllm#52071", "vllm-project/vllm#42187")),
    (
        "v1_pp_async_allowed",
        "V1's model runner with pipeline parallelism and async scheduling, the refusal lifted (vLLM's "
        "fix for vllm#45014 was to refuse it): a structured-output request is scheduled again while its "
        "token is in flight; the engine core defers its grammar mask and processes the oldest batch in "
        "flight first, which with three stages may be another: the mask is built from a grammar a token "
        "behind and the grammar rejects the token sampled under it (\"Failed to advance FSM\"); the stages "
        "also disagree on a request's token count (the non-last stages' own bookkeeping), so they skip "
        "different sampled-id broadcasts and the first stage can embed a placeholder id (-1)",
        "structured_output", PATHS_SUITE, CONFIG_PY,
        "        if (\n"
        "            self.parallel_config.pipeline_parallel_size > 1\n"
        "            and self.scheduler_config.async_scheduling\n"
        "        ):\n"
        "            unsupported.append(\"pipeline parallelism with async scheduling\")\n",
        "        if False:  # the refusal lifted (vllm#45014 re-created)\n"
        "            unsupported.append(\"pipeline parallelism with async scheduling\")\n",
        ("vllm-project/vllm#45014",)),
    (
        "preempt_stales_one_frame",
        "a preemption marks one decode frame of what is in flight stale (right with one step in "
        "flight, as #47900 assumed: every token in flight is then that frame's); with two decode "
        "frames in flight (pipeline parallelism's batch queue of 3) the older frame's token drains "
        "against the reset request: its output placeholders underflow (the engine core's assertion). "
        "The same miscount meets a speculative frame (1 + k placeholders in flight, spec-draft), which "
        "stock configurations reach",
        "preemption_in_flight", PATHS_SUITE, SCHED,
        "        request.num_stale_output_tokens = request.num_in_flight_tokens\n"
        "        request.num_output_placeholders = 0\n"
        "        request.num_preemptions += 1\n"
        "        if self.log_stats:\n"
        "            request.record_event(EngineCoreEventType.PREEMPTED, timestamp)\n",
        "        request.num_stale_output_tokens = request.num_in_flight_tokens - max(0, request.num_output_placeholders - 1)\n"
        "        request.num_output_placeholders = 0\n"
        "        request.num_preemptions += 1\n"
        "        if self.log_stats:\n"
        "            request.record_event(EngineCoreEventType.PREEMPTED, timestamp)\n",
        ("vllm-project/vllm#48245", "vllm-project/vllm#47900")),
]]

# the configuration each patch needs (harness.targets.vllm.configs): the bug exists only there.
# preempt_stales_one_frame's namesake, two decode frames in flight at a preemption, exists only on
# pp3-v1 beside v1_pp_async_allowed, which fails there by itself (TWO_FRAMES): it is judged where a
# stock configuration puts more than one token of a request in flight at a preemption, a speculative
# frame (spec-draft: stock quiet, the patch's engine core dies on `num_stale_output_tokens >= 0`)
CONFIG = {"rank_keeps_finished_state": "tp2", "pp_decode_no_stagger": "pp2", "v1_pp_async_allowed": "pp3-v1",
          "preempt_stales_one_frame": "spec-draft"}

# why a patch cannot be shown on the release its text was copied from (0.32.0): none left
UNREACHABLE: dict[str, str] = {}

# why two frames in flight at a preemption (vllm#48245's own form) are not judged on 0.32.0, read from
# its code (the facts: tests/test_vllm_patches.py) and measured (docs/results/2026-12-07-pp3-v1.md)
TWO_FRAMES = (
    "two decode frames in flight at a preemption are reached by no stock configuration of vLLM 0.32.0 (the "
    "patched count differs from stock only for a request preempted with two or more output placeholders: a "
    "speculative frame's, or two frames'); with V2 + PP + async the scheduler lets a "
    "request decode again only pipeline-size steps later (AsyncScheduler.decode_stagger = pp_size, "
    "next_decode_eligible_step: vllm#32359's constraint) and the batch queue holds pipeline size + 1 "
    "steps, so the queue is full from the moment a request's second decode is scheduled until its "
    "first is processed (EngineCore.step_with_batch_queue blocks there): schedule(), the only place a "
    "request is preempted for KV, and reset_prefix_cache, run between steps, never see two of its "
    "frames in flight. V1 has no stagger but refuses PP with async (vllm#45014), and with the refusal "
    "lifted its batch queue holds pipeline size steps (VllmConfig.max_concurrent_batches), one in "
    "flight at each schedule; the synchronous scheduler keeps no placeholders. The overlap line "
    "counts the preemptions that met two frames. V1 with PP=3 (pp3-v1, a queue of 3, the refusal lifted) "
    "reaches it, but only beside v1_pp_async_allowed, which fails there by itself, so no quiet arm "
    "judges the two-frame form. Measured 2026-12-07 (docs/results/2026-12-07-pp3-v1.md): with both patches "
    "the engine core died in the first case with `assert request.num_output_placeholders >= 0` "
    "(async_scheduler.py:71, vllm#48245's own symptom) 3 of 3 times; with v1_pp_async_allowed alone that "
    "assertion never came (0 of the 11 runs whose server logs were kept: the grammar refused a token, or stage 0 raised IndexError)")
