"""Timelines of a run: Chrome-trace JSON (opens in Perfetto) and a PNG with one lane
for the host and one per stream, like the article's Figures 1, 10 and 11."""
from __future__ import annotations

import json
import os

from harness.device.stream import Device

LANES = ("host", "schedule", "forward", "copy")


def _lanes(dev: Device) -> list[str]:
    names = [s for s in dev.streams]
    return ["host"] + sorted(names, key=lambda s: (LANES.index(s) if s in LANES else 99, s))


def chrome_trace(dev: Device, steps: tuple[int, int] | None = None) -> dict:
    lanes = _lanes(dev)
    tid = {name: i for i, name in enumerate(lanes)}
    keep = (lambda s: True) if steps is None else (lambda s: steps[0] <= s <= steps[1])
    ev = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": tid[n], "args": {"name": n}} for n in lanes]
    for h in dev.host_spans:
        if keep(h.step):
            ev.append({"ph": "X", "name": h.name, "pid": 1, "tid": 0, "ts": h.start * 1e3,
                       "dur": max(h.end - h.start, 0.0) * 1e3, "args": {"step": h.step, "site": h.site}})
    for op in dev.ops:
        if not keep(op.step):
            continue
        base = {"name": op.name, "pid": 1, "tid": tid.get(op.stream, 0), "ts": op.start * 1e3,
                "args": {"step": op.step, "site": op.site, "op": op.id}}
        if op.kind in ("kernel", "copy"):
            ev.append(dict(base, ph="X", dur=max(op.end - op.start, 0.0) * 1e3))
        else:
            ev.append(dict(base, ph="i", s="t"))
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def draw_png(dev: Device, path: str, steps: tuple[int, int] | None = None, title: str = "", *,
             highlight: int | None = None, marks: tuple = ()) -> None:
    """One lane for the host and one per stream; `highlight` shades a step (a failing one) and
    `marks` (op ids, e.g. a hazard's two accesses) are outlined in red and labelled."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = _lanes(dev)
    y = {n: len(lanes) - 1 - i for i, n in enumerate(lanes)}
    keep = (lambda s: True) if steps is None else (lambda s: steps[0] <= s <= steps[1])
    fig, ax = plt.subplots(figsize=(12, 0.7 * len(lanes) + 1.2), dpi=100)
    colors = {"prepare": "#4c72b0", "launch": "#55a868", "process": "#c44e52", "wait": "#dddddd",
              "blocking-call": "#ff8800"}
    for h in dev.host_spans:
        if keep(h.step) and h.end > h.start:
            ax.barh(y["host"], h.end - h.start, left=h.start, height=0.6, color=colors.get(h.name, "#8172b2"),
                    edgecolor="black" if h.name == "blocking-call" else "none")
    palette = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b2", "#937860"]
    if highlight is not None:
        spans = [(op.start, op.end) for op in dev.ops if op.step == highlight and op.stream in y]
        spans += [(h.start, h.end) for h in dev.host_spans if h.step == highlight]
        if spans:
            ax.axvspan(min(a for a, _ in spans), max(b for _, b in spans), color="#ffdd55", alpha=0.25, zorder=0)
    marks = set(marks or ())
    for op in dev.ops:
        if op.id in marks and op.stream in y and keep(op.step):
            w = max(op.end - op.start, 0.01)
            ax.barh(y[op.stream], w, left=op.start, height=0.8, fill=False, edgecolor="red", linewidth=1.8,
                    zorder=5)
            ax.annotate(f"{op.name} #{op.id}", (op.start + w / 2, y[op.stream] - 0.42), color="red",
                        fontsize=7, ha="center", va="top", zorder=6)
    for op in dev.ops:
        if not keep(op.step) or op.stream not in y:
            continue
        if op.kind in ("kernel", "copy"):
            w = max(op.end - op.start, 0.002)
            ax.barh(y[op.stream], w, left=op.start, height=0.6, color=palette[op.step % len(palette)],
                    edgecolor="black", linewidth=0.3)
            if op.stream == "forward" and w > 0.5:
                ax.text(op.start + w / 2, y[op.stream], f"{op.step}", ha="center", va="center", fontsize=7)
        elif op.kind == "record" and op.name == "shared_read_done":
            ax.plot([op.start], [y[op.stream] + 0.38], marker="v", color="red", markersize=6)
        elif op.kind == "wait" and "shared_read_done" in op.name:
            ax.plot([op.start], [y[op.stream] + 0.38], marker="|", color="red", markersize=10)
    ax.set_yticks([y[n] for n in lanes])
    ax.set_yticklabels(lanes)
    ax.set_xlabel("time (ms, virtual)" if dev.kind == "sim" else "time (ms)")
    ax.set_title(title or "streams (red: fence event recorded / waited on)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, metadata={"Description": "lanes: " + ",".join(lanes)})
    plt.close(fig)


def png_size(n_lanes: int) -> tuple[int, int]:
    """(width, height) in pixels of a timeline PNG with `n_lanes` lanes."""
    return 1200, int(round(100 * (0.7 * n_lanes + 1.2)))


def write_timeline(dev: Device, outdir: str, steps: tuple[int, int] | None = None, title: str = "", *,
                   highlight: int | None = None, marks: tuple = ()) -> dict:
    os.makedirs(outdir, exist_ok=True)
    trace = os.path.join(outdir, "trace.json")
    with open(trace, "w") as f:
        json.dump(chrome_trace(dev, steps), f)
    png = os.path.join(outdir, "timeline.png")
    if steps is None:  # a whole run is unreadable in one picture: show the first steady steps
        n = max((op.step for op in dev.ops), default=0)
        steps = (min(2, n), min(6, n))
    draw_png(dev, png, steps, title, highlight=highlight, marks=marks)
    return {"trace": trace, "png": png}
