"""The embedded reference engine as a target; faults are injected into it by name."""
from __future__ import annotations

from harness.device.timeline import step_summary
from harness.engine.build import build_engine
from harness.engine.config import EngineConfig
from harness.targets.base import Run, Target
from harness.workloads.presets import clone


class RefTarget(Target):
    name = "ref"
    white_box = True

    def __init__(self, faults=frozenset(), model: str = "tiny", **engine_kw):
        self.faults = frozenset(faults)
        self.model = model
        self.engine_kw = engine_kw

    @property
    def invariance(self):
        """The engine's batch invariance as measured on this machine (harness.engine.invariance)."""
        if getattr(self, "_invariance", None) is None:
            self._invariance = self.engine()[0].invariance
        return self._invariance

    @property
    def batch_invariant(self) -> bool:
        """Exact only where measured so: elsewhere the suites judge by tie or race, as for a real engine."""
        return self.invariance.ok

    def engine(self, overlap=True, policy="serial", seed=0, **kw):
        cfg = EngineConfig(model=self.model, overlap=overlap, policy=policy, seed=seed, faults=self.faults,
                           **{**self.engine_kw, **kw})
        return build_engine(cfg)

    def tokenizer(self):
        return self.engine()[1]

    def run(self, reqs, *, overlap=True, policy="serial", seed=0, track=False, on_step=None, **kw) -> Run:
        eng, _ = self.engine(overlap, policy, seed, **kw)
        tracker = None
        if track:
            from harness.hazards.tracking import AccessTracker
            tracker = AccessTracker(eng.dev, log=track if isinstance(track, tuple) else ())
            eng.dev.tracker = tracker
        reqs = clone(reqs)
        eng.run(reqs, on_step=on_step)
        if tracker is not None:
            tracker.flush()
        return Run([(r.rid, r.output_ids, r.finish_reason) for r in reqs], eng, tracker, step_summary(eng.dev))
