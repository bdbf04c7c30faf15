"""The engine thread: the only thread that touches the Engine.

HTTP handlers (coroutines on the server's event loop) submit and abort through `inbox`, a
thread-safe queue. The engine thread takes what is queued, calls step() while there is work,
and collects each request's new tokens (or its finish) from the engine's listener; after each
round it hands the whole batch of updates to the event loop in one call, so a step costs one
cross-thread wake-up, not one per token.
"""
from __future__ import annotations

import asyncio
import queue
import sys
import threading
from dataclasses import dataclass, field

from harness.engine.request import Request
from harness.serve.protocol import Update

RECENT_WINDOW = 256  # per-step records (spec accept lengths) a long-lived server keeps


@dataclass
class Handle:
    req: Request
    q: asyncio.Queue = field(default_factory=asyncio.Queue)  # made on the event loop; read there
    index: int = 0  # the choice this request answers: one HTTP request's handles share `q`
    sent: int = 0  # tokens already handed over (engine thread only)


class EngineThread(threading.Thread):
    """Owns the Engine; everything else talks to it through `inbox`."""

    def __init__(self, engine, metrics=None):
        super().__init__(name="engine", daemon=True)
        self.eng = engine
        self.metrics = metrics
        self.inbox: queue.Queue = queue.Queue()
        self.handles: dict[int, Handle] = {}  # id(Request) -> handle (engine thread only)
        self.error: str | None = None
        self.served = 0
        self.loop: asyncio.AbstractEventLoop | None = None  # set by the server when it starts
        self._out: list[tuple[Handle, Update]] = []
        self._new_tokens = 0  # generated this round, for the metrics
        self._halt = threading.Event()
        engine.listener = self._on_update

    # -- event-loop side ------------------------------------------------------------------
    def submit(self, h: Handle) -> None:
        if self.error is not None:
            h.q.put_nowait((h.index, Update([], [], error=f"the engine crashed: {self.error}")))
            return
        self.inbox.put(("submit", h))

    def abort(self, h: Handle) -> None:
        self.inbox.put(("abort", h))

    def close(self, why: str) -> None:
        """End every request in flight with `why` as its error, then stop (graceful shutdown)."""
        self.inbox.put(("close", why))

    def stop(self) -> None:
        self._halt.set()
        self.inbox.put(("wake", None))

    # -- engine-thread side -----------------------------------------------------------------
    def run(self) -> None:
        idle_synced = True
        while not self._halt.is_set():
            try:
                busy = self.eng.has_work()
                if not busy and not idle_synced:
                    self.eng.dev.finish()  # run whatever is still queued before waiting
                    idle_synced = True
                    if self.metrics is not None:
                        self.metrics.went_idle(self.eng)
                self._drain(block=not busy)
                if self._halt.is_set():
                    break
                if self.eng.has_work():
                    self.eng.step()
                    idle_synced = False
                    self._after_step()
            except Exception as e:  # noqa: BLE001 - report the crash to every waiting client
                self._crash(f"{type(e).__name__}: {e}")
                return
            finally:
                self._flush()

    def _after_step(self) -> None:
        if self.metrics is not None:
            self.metrics.after_step(self.eng)
        spec = self.eng.spec
        if spec is not None and len(spec.accept_lens) > 2 * RECENT_WINDOW:
            del spec.accept_lens[:-RECENT_WINDOW]  # read as a recent mean; a window bounds it

    def _drain(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, h = item
            if kind == "submit":
                try:
                    self.eng.submit(h.req)
                    self.handles[id(h.req)] = h
                    if self.metrics is not None:
                        self.metrics.prompt_tokens.inc(len(h.req.prompt_ids))
                except ValueError as e:
                    self._out.append((h, Update([], [], error=str(e))))
            elif kind == "abort" and id(h.req) in self.handles:
                self.eng.abort(h.req)
            elif kind == "close":
                self._fail_all(h, abort=True)
                self._halt.set()
                self._flush()
                return
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _on_update(self, r: Request) -> None:
        h = self.handles.get(id(r))
        if h is None:
            return
        new, lps = r.output_ids[h.sent:], r.output_logprobs[h.sent:]
        h.sent = len(r.output_ids)
        fin = r.finish_reason if r.finished else None
        if fin is not None:
            del self.handles[id(r)]  # reported: the engine thread keeps nothing of it
            self.served += 1
        self._new_tokens += len(new)
        if self.metrics is not None:
            if fin is not None:
                self.metrics.finished.labels(finish_reason=fin).inc()
        self._out.append((h, Update(list(new), list(lps), fin)))

    def _flush(self) -> None:
        """Hand this round's updates to the event loop in one call."""
        if self._new_tokens and self.metrics is not None:
            self.metrics.generation_tokens.inc(self._new_tokens)  # once a round, not once a token
        self._new_tokens = 0
        if not self._out:
            return
        out, self._out = self._out, []
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(_deliver, out)
        except RuntimeError:  # the loop closed between the check and the call
            pass

    def _fail_all(self, why: str, abort: bool) -> None:
        self.eng.listener = None  # the error is the last word each client gets (an abort would finish it first)
        for h in list(self.handles.values()):
            if abort:
                self.eng.abort(h.req)
            self._out.append((h, Update([], [], error=why)))
        self.handles.clear()
        while True:  # fail whatever was queued but not yet submitted
            try:
                kind, h = self.inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                self._out.append((h, Update([], [], error=why)))

    def _crash(self, why: str) -> None:
        self.error = why
        print(f"overlap-harness serve: the engine crashed: {why}", file=sys.stderr)
        self._fail_all(f"the engine crashed: {why}", abort=False)  # a broken engine is not asked again


def _deliver(out: list[tuple[Handle, Update]]) -> None:
    for h, u in out:
        h.q.put_nowait((h.index, u))
