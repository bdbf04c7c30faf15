"""The sampled-id copy, asynchronous on CPU as it is on a GPU.

On a GPU vLLM copies each step's sampled ids to pinned host memory with non_blocking=True and
records an event the output thread waits on before it reads them. On CPU that copy is a plain
synchronous one, so a missing wait or a missing second buffer does no harm there. The agent makes
it what it is on a GPU: a copy thread, into host buffers that are reused (two, each handed out
again only after its reader is done), with an event the reader waits on. This is where the
faults sampled_ids_no_wait and pinned_buffer_reuse bite, exactly as with a non_blocking copy into
pinned memory.
"""
from __future__ import annotations

import queue
import threading
import time
import weakref

from harness.agents.vllm import cuda_stubs, state
from harness.agents.vllm.points import output_attrs
from harness.agents.vllm import timing
from harness.agents.vllm.timing import step_period


class _CopyDone:
    """Stands in for the copy-ready event: record() is implied by the copy thread."""

    def __init__(self):
        self._done = threading.Event()

    def record(self, *a, **kw):
        pass

    def synchronize(self):
        if not self._done.is_set():
            timing.copy_wait_blocks()  # a step waiting on it before its forward: the worker's overlap lost
        self._done.wait()

    def query(self) -> bool:
        return self._done.is_set()


class _NoWait:
    def synchronize(self):
        pass


class _HostBuffer:
    def __init__(self):
        self.tensor = None
        self.writer = 0  # sequence number of the last copy queued into it
        self.free = threading.Event()
        self.free.set()
        # taking the buffer (new writer, not free) and a dying output's release_unread (free if still
        # its writer) exclude each other: else a release that read the old writer just before a take
        # frees the buffer the take now owns (re-entrant: the finalizer may run in the taking thread)
        self.lock = threading.RLock()

    def view(self, like):
        import torch
        n = like.numel()
        if self.tensor is None or self.tensor.numel() < n or self.tensor.dtype != like.dtype:
            self.tensor = torch.zeros(max(n, 1024), dtype=like.dtype)  # pinned memory is reused, not fresh
        return self.tensor[:n].view(like.shape)


class CopyEngine:
    """One copy thread and reused host buffers (two; one more than the pipeline's stages under PP)
    per worker process."""

    def __init__(self, buffers: int = 2):
        self.buffers = [_HostBuffer() for _ in range(buffers)]
        self.next = 0
        self.seq = 0
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._loop, name="oh-copy", daemon=True).start()

    def held(self) -> int:
        """Host buffers handed out whose reader is not done (the worker's books at idle: 0)."""
        return sum(1 for b in self.buffers if not b.free.is_set())

    def _loop(self):
        import torch
        while True:
            src, dst, done = self.q.get()
            try:
                state.PLAN.delay("output_copy", step_period())
                with torch.inference_mode():  # the buffers are made inside vLLM's inference mode
                    dst.copy_(src)
            except Exception as e:  # never leave a reader waiting forever
                state.facts("worker").set(error=f"overlap-harness agent: copy thread: {e}")
                state.facts("worker").write(True)
            finally:
                done._done.set()

    def start(self, src):
        """Queue a copy of `src` into a host buffer; (the buffer view, the event, the buffer)."""
        done = _CopyDone()
        if state.PLAN.fault("pinned_buffer_reuse"):
            buf = self.buffers[0]  # one buffer, reused without waiting for its reader
            self.seq += 1
            done.seq = buf.writer = self.seq
        else:
            buf = self.buffers[self.next % len(self.buffers)]
            self.next += 1
            waited = not buf.free.is_set()
            if waited:  # its output may be dead but not yet collected (a reference cycle)
                import gc
                gc.collect()
                t0 = time.monotonic()
            while True:
                buf.free.wait()  # handed out again only after the previous reader is done
                with buf.lock:
                    if buf.free.is_set():
                        self.seq += 1
                        done.seq = buf.writer = self.seq  # ours before it stops being free
                        buf.free.clear()
                        break
            if waited:  # back-pressure a GPU's fresh pinned tensor per step does not have: counted, a cost
                f = state.facts("worker")
                f.add("copy_buffer_waits")
                f.add("copy_buffer_wait_ms", int((time.monotonic() - t0) * 1000))
        dst = buf.view(src)
        self.q.put((src, dst, done))
        return dst, done, buf


COPY: CopyEngine | None = None  # the worker's, made on its first async output


def pipeline_buffers() -> int:
    """The host buffers the worker's copies need so that no copy waits for a reader vLLM lets lag:
    one more than the pipeline's stages (PP=2 keeps 3 steps in flight on V2), at least two. With two
    under PP=2 a reader two steps late held the third copy back: 33 of 41 copies waited, 19.6 s in
    all (the pp2 reset replay, 2026-12-07), a brake a GPU's fresh pinned tensor per step does not put
    on the worker. Without PP, two: the stock gates counted no wait (copy_buffer_waits)."""
    try:
        from vllm.distributed.parallel_state import get_pp_group
        return max(2, get_pp_group().world_size + 1)
    except Exception:  # noqa: BLE001 - no pipeline group in this process (a test): one stage
        return 2


def release_unread(buf: _HostBuffer, seq: int) -> None:
    """An output died: its buffer goes back only if it is still that output's (copy `seq` the last
    written into it). vLLM's worker loops keep the last output they handled alive until the next
    one arrives (multiproc_executor: `output = queue.get()`), so an output often dies after its
    reader freed the buffer and a later copy took it; freeing it then would let a third copy
    overwrite a buffer whose reader has not read it yet."""
    with buf.lock:
        if buf.writer == seq:  # still this output's buffer: nobody will read it now
            buf.free.set()


def output_copy(orig):
    ids_attr, event_attr = output_attrs(state.release_facts())

    def __init__(self, *a, **kw):
        global COPY
        with cuda_stubs.cuda_stubs(cuda_stubs.STUB_CUDA["on"], a + tuple(kw.values())):
            orig(self, *a, **kw)
        state.facts("worker").add("async_outputs")
        src = self._sampled_token_ids
        if src.device.type != "cpu":
            return  # a real device: vLLM's own non_blocking copy and event are the real thing
        if COPY is None:
            COPY = CopyEngine(pipeline_buffers())
        dst, done, self._oh_buffer = COPY.start(src)
        # a rank whose outputs nobody reads (TP: only the output rank's go back to the engine core,
        # multiproc_executor._execute_worker_rpc drops the others unread) gives the buffer back when
        # the output dies, as pinned memory goes back to its allocator; only if no later copy took it
        weakref.finalize(self, release_unread, self._oh_buffer, done.seq)
        timing.LAST_COPY[0] = done  # what the next step's forward must not wait for
        setattr(self, ids_attr, dst)
        setattr(self, event_attr, done)
    return __init__


def before_wait(orig):
    event_attr = output_attrs(state.release_facts())[1]

    def get_output(self):
        state.PLAN.delay("before_wait", step_period())
        ev = getattr(self, event_attr)
        if state.PLAN.fault("sampled_ids_no_wait"):
            setattr(self, event_attr, _NoWait())
        try:
            return orig(self)
        finally:
            setattr(self, event_attr, ev)
            buf = getattr(self, "_oh_buffer", None)
            if buf is not None and buf.writer != ev.seq and not state.PLAN.fault("pinned_buffer_reuse"):
                # a later copy was queued into the buffer before we read it, with no fault asking for
                # that: the agent's own error, and the target refuses to judge the run (overwritten_line)
                state.facts("worker").add("buffer_overwritten")
            if buf is not None:
                ev.synchronize()  # the copy itself has landed before the buffer is handed out again
                buf.free.set()
                f = state.facts("worker")
                if isinstance(f.data.get("books"), dict):  # the worker's books were written after its
                    # step, before this read freed the buffer: after a run's last step nothing else
                    # rewrites them (0.11.0's gate read 1 buffer held at idle, async on)
                    f.set(books={**f.data["books"], "host_buffers_held": COPY.held() if COPY else 0})
            state.facts("worker").write()
    return get_output
