"""A stand-in for an SGLang server, for the sglang target's tests on CPU (SGLang's scheduler
does not import without a CUDA torch).

It puts modules shaped like SGLang 0.5.23's at the agent's patch points into sys.modules (the
signatures tests/test_sglang_agent.py checks against the contract table), runs a scheduler
thread whose loops follow `Scheduler.event_loop_overlap` / `event_loop_normal` line for line
where the agent looks (run_batch launches step N+1, the WAR barrier, the result queue,
process_batch_result waits on step N's copy-done event), a "device" thread that runs each
launched step after a short sleep, and /health + /generate in SGLang's shape (the output is the
prompt's ids reversed, cycled: the same with overlap on and off). The real agent gets in as it
does in SGLang: `register()` called from `run_scheduler_process`.

Faults of the stand-in itself (environment, set by the test):
- STAND_IN_WAIT_FIRST=1: the overlap loop processes step N's result before it launches step
  N+1 (one moved line; the overlap flag, the barrier and the queue unchanged);
- STAND_IN_STALL_AFTER=K: the device never finishes step K (a hung engine).

    python sglang_stand_in.py --model-path M --host 127.0.0.1 --port P ... [--disable-overlap-schedule]
"""
import json
import os
import sys
import threading
import time
import types
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STEP_S = 0.002  # the device's time for one step
WAIT_FIRST = os.environ.get("STAND_IN_WAIT_FIRST") == "1"
STALL_AFTER = int(os.environ.get("STAND_IN_STALL_AFTER", "0"))


class Req:
    def __init__(self, rid, input_ids, max_new_tokens):
        self.rid, self.input_ids, self.max_new_tokens = rid, input_ids, max_new_tokens
        self.output_ids = []
        self.scheduled = 0  # tokens launched so far (ahead of output_ids by the step in flight)
        self.done = threading.Event()

    def token_at(self, i):
        rev = self.input_ids[::-1]
        return rev[i % len(rev)]


class Mode:
    def __init__(self, extend):
        self.extend = extend

    def is_extend(self):
        return self.extend


class Batch:
    def __init__(self, reqs, extend):
        self.reqs, self.forward_mode = reqs, Mode(extend)
        self.extend_num_tokens = sum(len(r.input_ids) for r in reqs) if extend else None

    def copy(self):
        b = Batch(self.reqs[:], False)
        b.forward_mode, b.extend_num_tokens = self.forward_mode, self.extend_num_tokens
        return b


class CopyDone:
    """Step N's copy-done event: set by the device thread when the step's tokens are ready."""

    def __init__(self, fut):
        self.fut = fut

    def synchronize(self):
        self.fut.result()

    def query(self):
        return self.fut.done()


class Result:
    def __init__(self, fut):
        self.copy_done = CopyDone(fut)
        self.fut = fut


class Stream:
    def wait_event(self, ev):
        pass

    def wait_stream(self, other):
        pass


class Runner:
    shared_read_done_event = "read-done"


class TpModelWorker:
    last_shared_read_runner = Runner()

    def __init__(self):
        self.device = ThreadPoolExecutor(1, thread_name_prefix="device")
        self.launched = 0

    def forward_batch_generation(self, batch):
        """Queues the step on the device and returns at once, as a CUDA launch does."""
        self.launched += 1
        picks = [(r, r.token_at(r.scheduled - 1)) for r in batch.reqs]  # positions fixed at launch
        stall = STALL_AFTER and self.launched >= STALL_AFTER

        def run():
            if stall:
                threading.Event().wait()  # never ends: the host waits on this step for ever
            time.sleep(STEP_S)
            return picks
        return Result(self.device.submit(run))


class FutureMap:
    def stash(self, future_indices, payload):
        pass


class CPUGraphRunner:  # the stand-in runs no graph: never called
    def prepare_replay(self, forward_batch, skip=False):
        return forward_batch


class ReqToTokenPool:  # the stand-in keeps no table: never called
    def write(self, indices, values):
        pass


def assign_req_to_token_pool_func(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                  batch_size):
    pass


class SchedulerInvariantChecker:  # SGLang's idle checks: nothing to check here
    def _check_req_pool(self):
        pass

    def _report_leak(self, pool_name, token_msg):
        pass


class ScheduleBatch:
    def retract_decode(self):  # never called here: nothing runs out of KV
        return [], 0.0, []

    def cumulate_penalty_output_tokens(self):  # never called here: no penalties
        pass


class Scheduler:
    def __init__(self, overlap):
        self.enable_overlap = overlap
        self.schedule_stream, self.forward_stream, self.copy_stream = Stream(), Stream(), Stream()
        self.model_worker = TpModelWorker()
        self.future_map = FutureMap()
        self.inbox, self.running = deque(), []
        self.wake = threading.Event()
        self.last_batch = None
        self._sched_idled = False

    # -- what the loops call, in SGLang's names ----------------------------------------------
    def ingest_requests(self):
        self.new = []
        while self.inbox:
            self.new.append(self.inbox.popleft())

    def get_next_batch_to_run(self):
        if self.new:  # a prefill of the new requests first, then everyone's decode
            reqs, extend = self.new, True
            self.running += reqs
        else:
            reqs, extend = [r for r in self.running if r.scheduled < r.max_new_tokens], False
        for r in reqs:
            r.scheduled += 1
        self.running = [r for r in self.running if r.scheduled < r.max_new_tokens]
        return Batch(reqs, extend) if reqs else None

    def run_batch(self, batch, pp_proxy_tensors=None):
        self._sched_idled = False
        result = self.model_worker.forward_batch_generation(batch)
        self._copy_result_to_cpu(result, batch)
        return result

    def _copy_result_to_cpu(self, batch_result, batch):
        pass

    def _reqs_finishing_inflight(self, batch):
        return []

    def abort_request(self, recv_req):
        pass

    def launch_batch_sample_if_needed(self, batch_result, cur_batch):
        pass

    def _apply_war_barrier(self):
        self.schedule_stream.wait_event(self.model_worker.last_shared_read_runner.shared_read_done_event)

    def process_batch_result(self, batch, result):
        result.copy_done.synchronize()  # as SGLang's result processors do first
        for r, tok in result.fut.result():
            r.output_ids.append(tok)
            if len(r.output_ids) >= r.max_new_tokens:
                r.done.set()

    def on_idle(self):
        self.wake.wait(0.05)
        self.wake.clear()

    # -- the two loops, shaped as SGLang 0.5.23's -----------------------------------------------
    def event_loop_overlap(self):
        self.result_queue = deque()

        def pop_and_process():
            tmp_batch, tmp_result = self.result_queue.popleft()
            self.process_batch_result(tmp_batch, tmp_result)

        while True:
            self.ingest_requests()
            batch = self.get_next_batch_to_run()
            if WAIT_FIRST and self.result_queue:
                pop_and_process()  # the fault: step N's result before step N+1 is launched
            if batch:
                batch_result = self.run_batch(batch)
                self._apply_war_barrier()
                self.result_queue.append((batch.copy(), batch_result))
            else:
                self._sched_idled = True
            if self.last_batch and self.result_queue and not WAIT_FIRST:
                pop_and_process()
            elif batch is None and not self.result_queue:
                self.on_idle()
            self.last_batch = batch

    def event_loop_normal(self):
        while True:
            self.ingest_requests()
            batch = self.get_next_batch_to_run()
            if batch:
                result = self.run_batch(batch)
                self.process_batch_result(batch, result)
            else:
                self._sched_idled = True
                self.on_idle()
            self.last_batch = batch


def install_modules():
    """SGLang's module names, with the stand-in's classes at the agent's points."""
    names = ["sglang", "sglang.srt", "sglang.srt.managers", "sglang.srt.managers.scheduler",
             "sglang.srt.managers.tp_worker", "sglang.srt.managers.overlap_utils",
             "sglang.srt.managers.schedule_batch", "sglang.srt.managers.scheduler_components",
             "sglang.srt.managers.scheduler_components.invariant_checker",
             "sglang.srt.model_executor", "sglang.srt.model_executor.cpu_graph_runner",
             "sglang.srt.mem_cache", "sglang.srt.mem_cache.memory_pool", "sglang.srt.mem_cache.allocation"]
    for n in names:
        sys.modules[n] = types.ModuleType(n)
    sys.modules["sglang.srt.managers.scheduler"].Scheduler = Scheduler
    sys.modules["sglang.srt.managers.tp_worker"].TpModelWorker = TpModelWorker
    sys.modules["sglang.srt.managers.overlap_utils"].FutureMap = FutureMap
    sys.modules["sglang.srt.model_executor.cpu_graph_runner"].CPUGraphRunner = CPUGraphRunner
    sys.modules["sglang.srt.mem_cache.memory_pool"].ReqToTokenPool = ReqToTokenPool
    sys.modules["sglang.srt.mem_cache.allocation"].assign_req_to_token_pool_func = assign_req_to_token_pool_func
    sys.modules["sglang.srt.managers.schedule_batch"].ScheduleBatch = ScheduleBatch
    sys.modules["sglang.srt.managers.scheduler_components.invariant_checker"].SchedulerInvariantChecker = \
        SchedulerInvariantChecker


def run_scheduler_process(overlap):
    """Named as SGLang's: the agent acts only inside it."""
    from harness.agents.sglang import install as sglang_agent
    install_modules()
    sglang_agent.register()  # what load_plugins() does through the entry point
    sched = Scheduler(overlap)
    loop = sched.event_loop_overlap if overlap else sched.event_loop_normal
    threading.Thread(target=loop, name="scheduler", daemon=True).start()
    return sched


def main(argv):
    port = int(argv[argv.index("--port") + 1])
    sched = run_scheduler_process("--disable-overlap-schedule" not in argv)
    counter = iter(range(1 << 30))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _reply(self, obj):
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._reply({})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            r = Req(f"req-{next(counter)}", list(body["input_ids"]), body["sampling_params"]["max_new_tokens"])
            sched.inbox.append(r)
            sched.wake.set()
            r.done.wait()
            ids = r.output_ids
            self._reply({"output_ids": ids, "meta_info": {
                "finish_reason": {"type": "length"},
                "output_token_logprobs": [[-0.1, i, None] for i in ids],
                "output_top_logprobs": [[[-0.1, i, None]] for i in ids]}})

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
