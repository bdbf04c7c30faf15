"""Is overlap real? The oracle for overlap that silently stops (issue 10, item 1).

Tokens cannot tell: a loop that waits for step N's result before issuing step N+1 gives the
right tokens and only loses time. Two facts of one run decide it, as the article measures it:

- order: with overlap on, every host wait on step N's copy-done event comes after step N+1's
  forward work was issued (unless the loop had nothing to issue: no step N+1 was planned before
  the wait). NGRAM's lookup needs the accepted tokens, so its wait before each step is the
  documented exception;
- time: the per-step GPU idle gap and period are those of an overlapped loop, judged against
  the overlap-off run of the same workload in the same process. Overlap can hide at most
  h = min(overlap-off gap, GPU busy time per step) of the CPU's work (a CPU-bound step keeps
  some gap); the gap with overlap on may keep at most GAP_FRACTION of h beyond the part it
  cannot hide, and the period must be shorter. On the sim's virtual clock the figures are exact.
"""
from __future__ import annotations

from dataclasses import dataclass, field

GAP_FRACTION = 0.25  # of the hideable CPU work, what an overlapped loop may still leave as GPU idle gap
MIN_STEPS = 3  # fewer steps give no gap to judge


@dataclass
class OverlapVerdict:
    effective: bool | None  # None: nothing to judge (overlap off, too few steps, or NGRAM)
    reasons: list[str] = field(default_factory=list)  # why LOST, first the most telling
    gap_on: float | None = None
    gap_off: float | None = None
    period_on: float | None = None
    period_off: float | None = None
    early_waits: int = 0  # host waits on step N's result before step N+1 was issued

    @property
    def line(self) -> str:
        """One line for `run` and `check` output."""
        if self.effective is None:
            return "overlap: " + (self.reasons[0] if self.reasons else "not judged")
        if self.effective:
            figs = (f" (GPU idle gap {self.gap_on:.3f} vs {self.gap_off:.3f} with overlap off, period "
                    f"{self.period_on:.3f} vs {self.period_off:.3f})" if self.gap_off is not None else "")
            return "overlap: effective" + figs
        return "overlap: LOST: " + self.reasons[0]

    def to_dict(self) -> dict:
        return {"effective": self.effective, "reasons": self.reasons, "gap_on": self.gap_on,
                "gap_off": self.gap_off, "period_on": self.period_on, "period_off": self.period_off,
                "early_waits": self.early_waits}


def early_waits(dev) -> list[str]:
    """Host waits on step N's copy-done that came before step N+1's first forward op was issued,
    although step N+1 had already been planned (a prepare phase ran before the wait and none
    between the wait and that op). Reads the device's op and host-span records."""
    by_id = {op.id: op for op in dev.ops}
    first_fwd: dict[int, int] = {}
    for op in dev.ops:
        if op.stream == "forward" and op.kind == "kernel":
            first_fwd.setdefault(op.step, op.id)
    spans = dev.host_spans
    out = []
    for i, h in enumerate(spans):
        if h.name != "wait" or h.event is None or h.seq < 0:
            continue
        ev = by_id.get(h.event)
        if ev is None or ev.stream != "copy":
            continue
        n = ev.step
        nxt = first_fwd.get(n + 1)
        if nxt is None or nxt < h.seq:
            continue  # no step N+1 at all, or issued before the wait: as it should be
        # the loop had nothing to issue at the wait: a later prepare planned step N+1
        if any(p.name == "prepare" and p.seq <= nxt for p in spans[i + 1:]):
            continue
        out.append(f"the host waited for step {n}'s result ({ev.name}) at {h.site} before issuing step "
                   f"{n + 1}, which was already planned")
    return out


def judge(on, off_summary: dict | None, ngram: bool = False) -> OverlapVerdict:
    """`on`: the overlap-on Engine after a run; `off_summary`: step_summary of the overlap-off run
    of the same workload (None: judge the order only)."""
    from harness.device.timeline import step_summary
    if not on.cfg.overlap:
        return OverlapVerdict(None, ["off (--no-overlap)"])
    if ngram:
        return OverlapVerdict(None, ["not judged (NGRAM waits for every step by design)"])
    if not on.dev.keep_ops:
        return OverlapVerdict(None, ["not judged (the device kept no op records)"])
    s = step_summary(on.dev)
    v = OverlapVerdict(True, gap_on=s["gpu_idle_gap_ms"], period_on=s["period_ms"])
    early = early_waits(on.dev)
    v.early_waits = len(early)
    if early:
        v.effective = False
        v.reasons.append(f"{len(early)} host wait(s) before the next step was issued; first: {early[0]}")
    if off_summary is not None:
        v.gap_off, v.period_off = off_summary["gpu_idle_gap_ms"], off_summary["period_ms"]
        if s["steps"] < MIN_STEPS or off_summary["steps"] < MIN_STEPS:
            if v.effective:
                return OverlapVerdict(None, [f"not judged (fewer than {MIN_STEPS} steps)"])
            return v
        hideable = min(v.gap_off, s["step_ms"])
        allowed = v.gap_off - (1 - GAP_FRACTION) * hideable
        if v.gap_off > 0 and v.gap_on > allowed:
            v.effective = False
            v.reasons.append(f"the GPU idles {v.gap_on:.3f} ms between steps (overlap off: {v.gap_off:.3f} ms; "
                             f"an overlapped loop leaves at most {allowed:.3f} ms): the CPU's work is not hidden")
        if v.period_on >= v.period_off:
            v.effective = False
            v.reasons.append(f"the step period {v.period_on:.3f} ms is no shorter than with overlap off "
                             f"({v.period_off:.3f} ms)")
    return v


def off_summary(cfg, reqs, build) -> dict:
    """step_summary of the same workload (fresh copies of `reqs`) with overlap off, on a new
    engine `build(cfg)` makes: what `overlap-harness run` judges its overlap-on run against."""
    from harness.device.timeline import step_summary
    from harness.workloads.presets import clone
    off, _ = build(cfg.with_(overlap=False))
    off.run(clone(reqs))
    return step_summary(off.dev)
