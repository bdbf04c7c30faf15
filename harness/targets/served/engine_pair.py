"""A pair of an engine's own servers that we start with our agent inside: what the vLLM and
SGLang targets share beyond ServedTarget (a pair of endpoints someone else started,
harness.targets.openai_pair, has none of it). The tokenizer is read from the model directory the
servers load, and the faults that are source patches of the engine run on the overlap-on server
only, in a private patched copy of the engine (harness.agents.source_patch); the off server stays
stock. A subclass names its engine's patch catalogue and what it does once a server is up.
"""
from __future__ import annotations

from harness.targets.served.pair import ServedTarget


class EnginePair(ServedTarget):
    def patch_catalogue(self) -> dict:
        """The engine's source patches by name (its agent's PATCHES)."""
        raise NotImplementedError

    def server_started(self, overlap: bool) -> None:
        """A server just came up healthy (its overlap setting checked): the engine's own follow-up."""

    def tokenizer(self):
        if self._tok is None:
            from harness.engine.smollm2 import HFTokenizer
            self._tok = HFTokenizer.from_dir(self.model_name())
        return self._tok

    def patches(self) -> list[str]:
        """The faults that are source patches of the engine."""
        return sorted(f for f in self.faults if f in self.patch_catalogue())

    def refresh_faults(self, old) -> None:
        """The faults changed: agent faults go to the plan; a different set of source patches
        restarts the overlap-on server on its own copy of the engine (the off server keeps
        running) when it is next used, not now: going back to the stock engine and on to the same
        patch again (a test's quiet half between two of its patched ones) costs no start."""
        self.set_plan(True)

    def _drop_stale_on(self) -> None:
        """Stop the overlap-on server when it runs other source patches than the faults ask for."""
        s = self.servers.get(True)
        if s is not None and getattr(s, "patches", None) != frozenset(self.patches()):
            self.servers.pop(True).stop()  # start() clears its facts

    def start(self, which=(False, True)) -> None:
        if True in which:
            self._drop_stale_on()
        fresh = True in which and True not in self.servers
        new = [o for o in which if o not in self.servers]
        super().start(which)
        if fresh and True in self.servers:
            self.servers[True].patches = frozenset(self.patches())
        for overlap in new:
            if overlap in self.servers:
                self.server_started(overlap)

    def url(self, overlap: bool) -> str:
        if overlap:
            self._drop_stale_on()
        return super().url(overlap)
