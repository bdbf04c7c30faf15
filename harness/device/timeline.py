"""Per-step figures from a device's op and host-span records, measured as the
article measures them: a step's GPU span runs from its first forward-stream
timestamp to its last; the gap is from one step's last to the next step's first."""
from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: `run` imports this before its flags are checked, and stream imports torch
    from harness.device.stream import Device


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def step_spans(dev: Device, stream: str = "forward") -> list[tuple[int, float, float]]:
    spans: dict[int, list[float]] = {}
    for op in dev.ops:
        if op.stream == stream and op.kind == "kernel":
            s = spans.setdefault(op.step, [op.start, op.end])
            s[0], s[1] = min(s[0], op.start), max(s[1], op.end)
    return [(k, v[0], v[1]) for k, v in sorted(spans.items())]


def step_summary(dev: Device) -> dict:
    spans = step_spans(dev)
    gaps = [max(0.0, b[1] - a[2]) for a, b in zip(spans, spans[1:])]
    periods = [b[1] - a[1] for a, b in zip(spans, spans[1:])]
    phases: dict[str, list[float]] = {}
    stall: dict[int, float] = {}
    for h in dev.host_spans:
        if h.name in ("wait", "blocking-call"):
            stall[h.step] = stall.get(h.step, 0.0) + (h.end - h.start)
        else:
            phases.setdefault(h.name, []).append(h.end - h.start)
    return {
        "steps": len(spans),
        "step_ms": _median([e - s for _, s, e in spans]),
        "period_ms": _median(periods),
        "gpu_idle_gap_ms": _median(gaps),
        "host_stall_ms": _median(list(stall.values())),
        "cpu_prepare_ms": _median(phases.get("prepare", [])),
        "cpu_launch_ms": _median(phases.get("launch", [])),
        "cpu_process_ms": _median(phases.get("process", [])),
        "total_ms": max((e for _, _, e in spans), default=0.0),
    }
