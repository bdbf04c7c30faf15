"""Prometheus metrics for `serve` (GET /metrics), with prometheus_client.

One registry per server, so two servers in one process (tests, overlap on/off pairs) do not
share counters. The engine thread updates everything here; the HTTP side only renders it.

The overlap idle gap is measured as the article measures it (harness/device/timeline.py):
from one step's last forward-stream kernel to the next step's first. The device's op records
are read once per step and dropped, so a long-running server keeps only a step or two of them.
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PREFIX = "overlap_harness"
GAP_BUCKETS_MS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 50.0, float("inf"))
KEEP_STEPS = 3  # op records of the newest steps stay: under overlap a step's ops are issued across two rounds


class Metrics:
    def __init__(self, model: str):
        r = self.registry = CollectorRegistry()
        self.running = Gauge(f"{PREFIX}_requests_running", "requests in the running batch", registry=r)
        self.waiting = Gauge(f"{PREFIX}_requests_waiting", "requests queued, not yet admitted", registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "prompt tokens of submitted requests", registry=r)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "tokens generated", registry=r)
        self.steps = Counter(f"{PREFIX}_steps", "engine steps launched", registry=r)
        self.finished = Counter(f"{PREFIX}_requests_finished", "requests finished, by reason", ["finish_reason"],
                                registry=r)
        self.http_errors = Counter(f"{PREFIX}_http_errors", "requests refused or failed, by status", ["status"],
                                   registry=r)
        self.disconnects = Counter(f"{PREFIX}_client_disconnects", "clients that went away mid-request",
                                   registry=r)
        self.idle_gap = Histogram(f"{PREFIX}_gpu_idle_gap_ms", "device idle gap between consecutive steps "
                                  "(forward stream, ms; virtual ms on the sim device)", buckets=GAP_BUCKETS_MS,
                                  registry=r)
        self.last_gap = Gauge(f"{PREFIX}_gpu_idle_gap_last_ms", "the newest step's idle gap (ms)", registry=r)
        info = Gauge(f"{PREFIX}_model_info", "the model served", ["model"], registry=r)
        info.labels(model=model).set(1)
        self._prev_end: float | None = None  # the last measured step's end, None after an idle period
        self._steps_seen = 0

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    # -- engine thread only -------------------------------------------------------------------
    def after_step(self, eng) -> None:
        """Count the steps launched, read the queue lengths and the idle gap of steps now
        complete, and drop the device records they came from."""
        self.steps.inc(eng.steps - self._steps_seen)
        self._steps_seen = eng.steps
        self.running.set(len(eng.sched.running))
        self.waiting.set(len(eng.sched.waiting))
        self._measure(eng, eng.steps - KEEP_STEPS)  # steps below this were processed: their ops ran

    def went_idle(self, eng) -> None:
        """The engine ran out of work (and synced): measure what is left, and start afresh, since
        the next step's gap would measure the wait for a client, not the scheduler."""
        self.after_step(eng)
        self._measure(eng, eng.steps)
        self._prev_end = None

    def _measure(self, eng, upto: int) -> None:
        dev = eng.dev
        if upto <= 0 or not dev.ops or dev.ops[0].step >= upto:
            dev.host_spans[:] = [h for h in dev.host_spans if h.step >= upto]
            return
        if hasattr(dev, "resolve_times"):  # cuda: fill the timing of ops that completed
            dev.resolve_times(block=False)
        cut = 0
        spans: dict[int, list[float]] = {}
        for op in dev.ops:
            if op.step >= upto:
                break
            cut += 1
            if op.stream == "forward" and op.kind == "kernel" and op.end > 0.0:
                s = spans.setdefault(op.step, [op.start, op.end])
                s[0], s[1] = min(s[0], op.start), max(s[1], op.end)
        del dev.ops[:cut]
        dev.host_spans[:] = [h for h in dev.host_spans if h.step >= upto]
        for step in sorted(spans):
            start, end = spans[step]
            if self._prev_end is not None:
                gap = max(0.0, start - self._prev_end)
                self.idle_gap.observe(gap)
                self.last_gap.set(gap)
            self._prev_end = end
