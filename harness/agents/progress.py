"""A served engine's progress, as every agent reports it for the target's hang watchdog
(harness.targets.served.pair.ServedTarget.watch, issue 17 item 2): tokens delivered (`tokens_out`),
the median gap between steps that delivered some (`token_period_ms`), a stack dump of every
thread on SIGUSR1 (`stacks-<pid>.txt` in the facts folder, for the HANG report), and a flusher
that writes changed facts within 0.1 s (Facts.write alone is throttled and would drop a run's
last counts). One copy for the vLLM and the SGLang agent; imported inside the engine's
processes: stdlib only.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time
from collections import deque

PERIODS = 64  # token periods kept for the median


class TokenClock:
    """Tokens one engine process delivered and the gaps between the steps that delivered some."""

    def __init__(self):
        self.last_t: float | None = None
        self.periods: deque = deque(maxlen=PERIODS)

    def delivered(self, facts, n: int, idle: bool) -> None:
        """A step handed `n` tokens on; `idle`: the engine has nothing left to run (the gap until
        the next burst is no step period)."""
        now = time.monotonic()
        if n:
            facts.add("tokens_out", n)
            if self.last_t is not None:
                self.periods.append(now - self.last_t)
            self.last_t = now
        if idle:
            self.last_t = None
        if n or idle:
            p = sorted(self.periods)  # the median: one long prefill step does not move it
            facts.set(token_period_ms=round(1000 * p[len(p) // 2], 3) if p else None)


_STACKS: dict = {}


def register_stack_dump(facts_dir: str | None) -> None:
    """SIGUSR1 makes this process write every thread's stack into facts_dir/stacks-<pid>.txt
    (faulthandler: works while the interpreter is stuck too); the file's existence tells the
    target this process can be asked. Once per process (a forked child registers again)."""
    pid = os.getpid()
    if pid in _STACKS or not facts_dir:
        return
    try:
        fh = open(os.path.join(facts_dir, f"stacks-{pid}.txt"), "w")
        faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return
    _STACKS[pid] = fh


def start_flusher(facts_of) -> None:
    """A daemon thread that writes each Facts of `facts_of()` within 0.1 s of a change."""
    def loop():
        while True:
            time.sleep(0.1)
            for f in list(facts_of()):
                if f.dirty:
                    f.write(True)
    threading.Thread(target=loop, name="oh-facts", daemon=True).start()
