"""The SGLang agent's device operations on SGLang's CPU backend (`--device cpu`).

On a CPU, SGLang's streams and events are PyTorch's CPU no-ops and its result "copy" returns
the very tensor the forward wrote (sglang.srt.utils.common.async_d2h: a CPU tensor is returned
as is), so step N's result is complete the moment run_batch returns: the overlap loop becomes
a reordering, and nothing the GPU leaves in flight is in flight here. The agent gives that
back at its points:

- a delay is the scheduler thread held back on the spot (the CPU's "stream" is that thread);
- the result copy (point `result_copy`) goes to a copy thread of the agent: the result's host
  fields (the sampled ids, their logprobs) are replaced by host buffers filled with a poison
  value, and the thread copies the real values in after the plan's delay, then sets the step's
  copy-done event. A reader that waits on copy_done (as SGLang's result processors do) sees the
  values; one that reads before its copy sees the poison, as it would see stale pinned memory
  on a GPU.
"""
from __future__ import annotations

import queue
import threading
import time

POISON_ID = -7  # no token id: a result read before its copy shows as this id


class HostCopyDone:
    """Step N's copy-done event on the CPU: set by the copy thread after the copy."""

    def __init__(self):
        self._done = threading.Event()
        self.on_sync = None  # the agent's fence model: the host has waited for this step

    def record(self, *a, **kw):
        pass  # recorded by the copy thread when the copy lands

    def synchronize(self, *a, **kw):
        self._done.wait()
        if self.on_sync is not None:
            self.on_sync()

    def query(self) -> bool:
        return self._done.is_set()

    def wait(self, *a, **kw):  # a stream asked to wait on it: the host waits (the CPU's only stream)
        self._done.wait()


# the result fields SGLang's result processors read on the host, after copy_done
_TENSOR_FIELDS = ("next_token_ids",)
_LOGIT_FIELDS = ("next_token_logprobs", "input_token_logprobs")
_LOGIT_LIST_FIELDS = ("next_token_top_logprobs_val", "next_token_top_logprobs_idx")


class ResultCopier:
    """One copy thread per scheduler process; copies complete in the order they were queued,
    as on one copy stream."""

    def __init__(self, torch_mod):
        self.torch = torch_mod
        self.q: queue.Queue = queue.Queue()
        self.copies = 0
        threading.Thread(target=self._loop, name="oh-sglang-copy", daemon=True).start()

    def _buffer(self, src):
        t = self.torch
        if not isinstance(src, t.Tensor):
            return src, None
        dst = t.empty_like(src)
        dst.fill_(POISON_ID if not src.is_floating_point() else float("nan"))
        return dst, src

    def start(self, result, delay_s: float) -> HostCopyDone:
        """Move `result`'s host fields into poisoned buffers and queue their copy; returns the
        copy-done event that now stands on result.copy_done."""
        pairs = []

        def swap(obj, name):
            src = getattr(obj, name, None)
            if src is None:
                return
            if isinstance(src, list):
                out = []
                for x in src:
                    dst, s = self._buffer(x)
                    out.append(dst)
                    if s is not None:
                        pairs.append((s, dst))
                setattr(obj, name, out)
                return
            dst, s = self._buffer(src)
            if s is not None:
                pairs.append((s, dst))
                setattr(obj, name, dst)

        for name in _TENSOR_FIELDS:
            swap(result, name)
        logits = getattr(result, "logits_output", None)
        if logits is not None:
            for name in _LOGIT_FIELDS + _LOGIT_LIST_FIELDS:
                swap(logits, name)
        done = HostCopyDone()
        result.copy_done = done
        self.q.put((pairs, done, delay_s))
        return done

    def _loop(self):
        while True:
            pairs, done, delay_s = self.q.get()
            try:
                if delay_s > 0:
                    time.sleep(delay_s)
                with self.torch.inference_mode():
                    for src, dst in pairs:
                        dst.copy_(src)
                self.copies += 1
            finally:
                done._done.set()  # never leave a reader waiting forever


class CpuOps:
    """CudaOps' interface on SGLang's CPU backend (see the module's docstring)."""

    def __init__(self):
        import torch
        self.torch = torch
        self.copier = ResultCopier(torch)

    def spin(self, ms: float, stream=None) -> None:
        time.sleep(ms / 1000.0)

    def record(self, stream):
        ev = HostCopyDone()
        ev._done.set()
        return ev

    def current_stream(self):
        return None

    def side_stream(self):
        return None

    def stream(self, s):
        import contextlib
        return contextlib.nullcontext()

    def keep_alive(self, tensors, stream) -> None:
        pass

    def blocking_read(self, stream) -> None:
        pass  # every read blocks on a CPU: nothing to add
