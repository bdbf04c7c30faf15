"""Where the SGLang agent patches, what it relies on there, and the SGLang fault catalogue.

Written against SGLang 0.5.23 (read from its wheel's source). One table serves both the agent
(which patches exactly these points and refuses to start, naming the point, when one is
missing) and `tests/test_sglang_contract.py` (which checks them with `ast` against the real
source, without importing SGLang: its scheduler does not import on a CPU-only torch).

The agent gets in through SGLang's own plugin group `sglang.srt.plugins`: every scheduler
subprocess calls `load_plugins()` first thing in `run_scheduler_process`, so the agent is
loaded inside the processes that own the streams, with no launcher of ours in between.
"""
from __future__ import annotations

from dataclasses import dataclass

WRITTEN_AGAINST = "0.5.23"
PLUGIN_GROUP = "sglang.srt.plugins"
BARRIER_BLOCK_MS = 1.0  # a correct WAR barrier only enqueues a wait: the host never blocks in it this long


@dataclass(frozen=True)
class Point:
    name: str  # the delay / fault point name the plan and the agent use
    module: str
    qualname: str  # "Class.method" or "function"
    params: tuple[str, ...]  # the leading positional parameters the agent's wrapper relies on
    refs: tuple[str, ...]  # names its body must mention (attributes, calls) for the wrapper to be right
    why: str


POINTS = [
    Point("scheduler_process", "sglang.srt.managers.scheduler", "run_scheduler_process",
          ("server_args", "port_args", "gpu_id"), ("load_plugins",),
          "the scheduler subprocess's entry: it loads the plugin group first, which is how the agent "
          "gets into the process that owns the streams"),
    Point("war_barrier", "sglang.srt.managers.scheduler", "Scheduler._apply_war_barrier", ("self",),
          ("schedule_stream", "forward_stream", "last_shared_read_runner", "shared_read_done_event",
           "wait_event", "_war_barrier_enabled"),
          "the write-after-read fence: the schedule stream waits on the forward's shared-read-done event "
          "(or the whole forward) before the next step's writes to req_to_token"),
    Point("overlap_loop", "sglang.srt.managers.scheduler", "Scheduler.event_loop_overlap", ("self",),
          ("run_batch", "_apply_war_barrier", "process_batch_result", "launch_batch_sample_if_needed",
           "result_queue", "_sched_idled"),
          "the overlap loop: run_batch launches step N+1, then the fence, then the previous step's results "
          "(result_queue); an idle turn sets _sched_idled"),
    Point("run_batch", "sglang.srt.managers.scheduler", "Scheduler.run_batch", ("self", "batch"),
          ("forward_stream_ctx", "forward_stream", "schedule_stream", "forward_batch_generation",
           "_copy_result_to_cpu", "future_map", "copy_done", "_sched_idled"),
          "launches a step on the forward stream (after it waits for the schedule stream) and returns its "
          "result, whose copy_done event the host later waits on: the host order's 'scheduled step N+1' "
          "(the agent reads _sched_idled first: an idle gap is no token period); the fence-placement fault "
          "records its early event here"),
    Point("result_wait", "sglang.srt.managers.scheduler", "Scheduler.process_batch_result",
          ("self", "batch", "result"),
          ("batch_result_processor", "process_batch_result_decode", "process_batch_result_prefill"),
          "the host takes step N's result (the same object run_batch returned): the host order's 'waits on "
          "step N' (the processors below block on its copy_done first)"),
    Point("copy_done_wait_decode", "sglang.srt.managers.scheduler_components.batch_result_processor",
          "SchedulerBatchResultProcessor.process_batch_result_decode", ("self", "batch", "result"),
          ("copy_done", "synchronize", "output_ids"),
          "where the host blocks on step N's copy-done event, then appends its tokens to each request: the "
          "agent times the wait on result.copy_done.synchronize() and counts the tokens in output_ids"),
    Point("copy_done_wait_prefill", "sglang.srt.managers.scheduler_components.batch_result_processor",
          "SchedulerBatchResultProcessor.process_batch_result_prefill", ("self", "batch", "result"),
          ("copy_done", "synchronize", "output_ids"), "the same for a prefill step"),
    Point("batch_reqs", "sglang.srt.managers.schedule_batch", "ScheduleBatch.batch_size", ("self",), ("reqs",),
          "a batch's requests (batch.reqs), whose ids the host order compares between steps"),
    Point("batch_tokens", "sglang.srt.managers.schedule_batch", "ScheduleBatch.prepare_for_extend", ("self",),
          ("extend_num_tokens", "forward_mode"),
          "an extend (prefill) batch's token count; a decode batch runs one token a request"),
    Point("req_fields", "sglang.srt.managers.schedule_batch", "Req.__init__", ("self",), ("rid", "output_ids"),
          "a request's id and its output tokens (their count before and after a result is progress)"),
    Point("forward", "sglang.srt.managers.tp_worker", "TpModelWorker.forward_batch_generation",
          ("self", "batch"), ("model_runner",),
          "runs on the forward stream, before the attention backend reads req_to_token: the forward "
          "delay spins the GPU here"),
    Point("result_copy", "sglang.srt.managers.scheduler", "Scheduler._copy_result_to_cpu",
          ("self", "batch_result", "batch"), ("copy_stream", "forward_stream", "copy_stream_ctx", "wait_stream"),
          "the result read-back on the copy stream, behind the forward: the copy delay spins the GPU there"),
    Point("shared_read_runner", "sglang.srt.managers.tp_worker", "BaseTpWorker.last_shared_read_runner",
          ("self",), ("model_runner",), "owns the event the WAR barrier waits on"),
    Point("runner_streams", "sglang.srt.model_executor.model_runner", "ModelRunner.__init__", ("self",),
          ("forward_stream", "shared_read_done_event"),
          "the forward stream and the read-done slot the barrier consumes"),
    Point("relay_stash", "sglang.srt.managers.overlap_utils", "FutureMap.stash",
          ("self", "future_indices", "payload"), ("output_tokens_buf", "bonus_tokens"),
          "writes step N's sampled tokens into the relay (FutureMap) on the forward stream"),
    Point("graph_pad", "sglang.srt.model_executor.cpu_graph_runner", "CPUGraphRunner.prepare_replay",
          ("self", "forward_batch"), ("req_pool_indices", "out_cache_loc", "seq_len_fill_value", "raw_bs",
                                      "batch_size", "zero_"),
          "the CPU graph runner (--enable-torch-compile) pads a decode batch of raw_bs rows up to the next "
          "captured size and returns the batch the graph runs: the padded rows' req-pool rows and KV slots "
          "(entry 0) are read there"),
    Point("table_write", "sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.write", ("self", "indices", "values"),
          ("req_to_token",), "every host write of req_to_token cells (a prefill's row, a decode step's new "
          "position, the prefix cache's rewrite): the fence model judges each against the forwards in flight"),
    Point("table_assign", "sglang.srt.mem_cache.allocation", "assign_req_to_token_pool_func",
          ("req_pool_indices", "req_to_token", "start_offset", "end_offset"), ("assign_req_to_token_pool_cpu",),
          "the batched req_to_token write (rows [start, end) each): judged as above"),
    Point("relay_gather", "sglang.srt.managers.overlap_utils", "resolve_forward_inputs",
          ("batch", "future_map"), ("output_tokens_buf", "req_pool_indices"),
          "step N+1 gathers its input ids from the relay: must follow the stash"),
    Point("plugins", "sglang.srt.plugins", "load_plugins", (), ("GENERAL_PLUGINS_GROUP",),
          "loads every entry point of the plugin group"),
    # -- the paths the overlap loop has, counted on both arms (counters.count_paths) ---------------
    Point("retract", "sglang.srt.managers.schedule_batch", "ScheduleBatch.retract_decode", ("self",),
          ("reqs",), "retraction: the KV pool cannot hold the next decode step; it returns the retracted "
          "requests first"),
    Point("finish_in_flight", "sglang.srt.managers.scheduler", "Scheduler._reqs_finishing_inflight",
          ("self", "batch"), ("result_queue", "next_output_finishes_by_length"),
          "the finish check one step late: requests whose queued (in-flight) result finishes them by "
          "length are left out of the next step"),
    Point("penalty_cumulate", "sglang.srt.managers.schedule_batch", "ScheduleBatch.cumulate_penalty_output_tokens",
          ("self",), ("output_ids", "origin_input_ids", "penalizer_orchestrator", "cumulate_output_tokens"),
          "where the penalties take in each request's newest token before a decode step (req.output_ids[-1]): "
          "the agent counts, per request, each time that token is one step old (the previous step's result "
          "not processed yet: the overlap loop), the evidence of KNOWN sglang-penalty-one-step-old"),
    Point("delayed_sample", "sglang.srt.managers.scheduler", "Scheduler.launch_batch_sample_if_needed",
          ("self", "batch_result"), ("delay_sample_func", "_copy_result_to_cpu"),
          "the overlap loop's delayed sampling (grammar): the step was launched before the previous token "
          "reached the grammar, and is sampled here once it has; counted when there is a sample to launch"),
    Point("abort", "sglang.srt.managers.scheduler", "Scheduler.abort_request", ("self", "recv_req"),
          ("chunked_req", "waiting_queue", "to_finish"),
          "an abort; one that names a request of the running batch or of a launched step is an abort of a "
          "running request (path_abort_running), one of a step whose result is still queued (result_queue) "
          "is the abort-with-a-step-in-flight path"),
    Point("books_idle", "sglang.srt.managers.scheduler_components.invariant_checker",
          "SchedulerInvariantChecker._check_req_pool", ("self",), ("req_to_token_pool", "free_slots"),
          "SGLang's own books at idle: the req_to_token rows, checked each time the scheduler is fully "
          "idle (on_idle), after its KV pool check"),
    Point("books_leak", "sglang.srt.managers.scheduler_components.invariant_checker",
          "SchedulerInvariantChecker._report_leak", ("self", "pool_name", "token_msg"), ("raise_error_or_warn",),
          "where SGLang's idle check reports a pool that is not back (a warning, or an error in strict mode)"),
    Point("req_prefix", "sglang.srt.managers.schedule_batch", "Req.__init__", ("self",),
          ("prefix_len", "grammar", "sampling_params"),
          "a request's cached prefix length at its extend (a prefix-cache hit when its first extend "
          "starts past 0), its grammar, its sampling parameters (penalties)"),
]
POINTS_BY_NAME = {p.name: p for p in POINTS}
DELAY_POINTS = ("forward", "result_copy")

# module-level constants the agent relies on: (module, name, value)
CONSTANTS = [("sglang.srt.plugins", "GENERAL_PLUGINS_GROUP", PLUGIN_GROUP),
             # SGLang refuses a request with more stop strings (400): the target sends at most this many
             ("sglang.srt.sampling.sampling_params", "MAX_STOP_COUNT", 32)]
MAX_STOP_COUNT = 32

# server flags the target passes (`--model-path` ...): fields of SGLang's argument groups
SERVER_FIELDS = [
    ("sglang.srt.arg_groups.fields.model", "model_path"),
    ("sglang.srt.arg_groups.fields.serving", "host"),
    ("sglang.srt.arg_groups.fields.serving", "port"),
    ("sglang.srt.arg_groups.fields.device", "random_seed"),
    ("sglang.srt.arg_groups.fields.schedule", "disable_overlap_schedule"),
    ("sglang.srt.arg_groups.fields.schedule", "mem_fraction_static"),
    ("sglang.srt.arg_groups.fields.exec_", "enable_deterministic_inference"),
    # the CPU backend's (harness.targets.sglang.target: device "cpu")
    ("sglang.srt.arg_groups.fields.device", "device"),
    ("sglang.srt.arg_groups.fields.exec_", "attention_backend"),
    ("sglang.srt.arg_groups.fields.model", "dtype"),
    ("sglang.srt.arg_groups.fields.schedule", "max_total_tokens"),
    ("sglang.srt.arg_groups.fields.schedule", "max_running_requests"),
    ("sglang.srt.arg_groups.fields.model", "context_length"),
    ("sglang.srt.arg_groups.fields.device", "sleep_on_idle"),
    # the path setting's (harness.targets.sglang.paths.SERVER_ARGS)
    ("sglang.srt.arg_groups.fields.schedule", "chunked_prefill_size"),
    ("sglang.srt.arg_groups.fields.schedule", "schedule_conservativeness"),
    # the CPU graph runner's (harness.targets.sglang.target.CPU_GRAPH_BS: padded batches, entry 0)
    ("sglang.srt.arg_groups.fields.exec_", "enable_torch_compile"),
    ("sglang.srt.arg_groups.fields.exec_", "cuda_graph_bs_decode"),
]


GPU_ONLY = ("rewires SGLang's streams and events, which are no-ops on its CPU backend: a CUDA GPU shows it "
            "(the CPU's faults are source patches, harness/agents/sglang/patches.py)")


@dataclass(frozen=True)
class SglangFault:
    name: str
    description: str
    point: str  # a POINTS name
    suite: str  # the black-box suite that must catch it
    upstream: tuple[str, ...] = ()
    # why a machine without a CUDA device cannot show it (`mutants` lists it and runs nothing):
    # every agent fault acts on the GPU's streams. The host knows whether a device is visible: the
    # target's catalogue (harness.targets.fault_catalogue) clears it where one is.
    device_only: str = GPU_ONLY


CATALOGUE: dict[str, SglangFault] = {f.name: f for f in [
    SglangFault("sglang_no_war_barrier", "Scheduler._apply_war_barrier made a no-op: the schedule stream no "
                "longer waits for the forward's reads of req_to_token before the next step's writes",
                "war_barrier", "test_overlap_equivalence",
                # the barrier's fix; its removal off CUDA; memory faults on ROCm without it
                ("sgl-project/sglang#26380", "sgl-project/sglang#26646", "sgl-project/sglang#38258")),
    SglangFault("sglang_fence_before_read", "the fence waits on an event recorded on the forward stream when "
                "the step is launched, before the attention metadata reads req_to_token, instead of the "
                "shared-read-done event after the last read", "war_barrier", "test_overlap_equivalence",
                # read-done event placement; the barrier moved to right after the launch; where reads end
                ("sgl-project/sglang#28363", "sgl-project/sglang#31687", "sgl-project/sglang#34052")),
    SglangFault("sglang_blocking_copy_schedule", "a blocking device-to-host copy on the schedule stream "
                "right after the fence: the host waits for the forward's reads, so the CPU no longer "
                "prepares step N+1 while step N runs (overlap silently lost)", "war_barrier",
                "test_overlap_equivalence",  # the target's overlap verdict fails the run
                ("sgl-project/sglang#26380",)),  # moved host syncs off the schedule stream for this reason
    SglangFault("sglang_relay_read_before_write", "FutureMap.stash moved to a side stream the next forward "
                "does not wait for: step N+1 gathers its input ids from the relay before step N's tokens "
                "land there (SGLang's CI poisons the relay with -1 for this class: SGLANG_IS_IN_CI)",
                "relay_stash", "test_overlap_equivalence"),
]}


def check_names(names, exc=ValueError) -> None:
    unknown = sorted(set(names) - set(CATALOGUE))
    if unknown:
        raise exc(f"unknown SGLang fault {', '.join(unknown)}; known: {', '.join(CATALOGUE)}")
