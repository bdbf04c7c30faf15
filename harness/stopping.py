"""A signal ends every command the way Ctrl-C does (issue 36).

SIGTERM is what a CI runner or `timeout` sends to cancel a job. Left to Python's default it
ends the process at once (no summary; the keepers take the servers down, the work folder goes
with them); handled as it was before (SystemExit raised inside a suite's case) pytest took it
for that case's failure, the next case started a new server pair and the run went on. Here the
first SIGTERM or SIGINT is noted and raised as KeyboardInterrupt in the main thread, which
every command turns into "stop, keep what was found, print a summary", and from then on:

- no server starts again: a served target's start() raises KeyboardInterrupt, so a suite or a
  search that would restart a pair for its next case ends instead;
- the servers already running are stopped at once, from a helper thread: the cases in flight
  (client threads waiting on HTTP for up to their own timeouts) end now, and the main thread's
  unwinding, which waits for those threads, is not held up by them;
- a server that goes away from then on is no CRASH or HANG finding: we stopped it;
- pytest's session ends as interrupted (exit 2), which the gate reports as "interrupted by
  SIGTERM" with what ran, not as "the suites could not run".

A second signal while winding down is ignored: the wind-down is bounded (a server gets
SIGKILL after its grace period), and a CI runner that sends SIGTERM twice must not cut the
summary short.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

_GOT: list[int] = []  # the signal that asked us to stop (first one only)


def install() -> None:
    """SIGTERM and SIGINT end the run as Ctrl-C does (main thread only: signals reach it alone)."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _handler)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        # Ctrl-C noted the same way; a shell that starts a job in the background has it ignore
        # SIGINT, and that choice stays
        signal.signal(signal.SIGINT, _handler)


def _handler(signum, frame) -> None:
    if _GOT:
        return
    note(signum)
    raise KeyboardInterrupt


def note(signum: int) -> None:
    """A stop was asked for (by `signum`): no server starts again; the running ones are stopped."""
    if _GOT:
        return
    _GOT.append(signum)
    _interrupt_children()
    served = sys.modules.get("harness.targets.served.process")  # only when this process started any
    if served is not None:
        threading.Thread(target=served.stop_all, name="stop-servers", daemon=True).start()


def _interrupt_children() -> None:
    """Ctrl-C at a terminal reaches the whole foreground group: our pytest-xdist workers and a
    sweep's `check` of one release end their own way (a summary, a JSON). SIGTERM reaches us
    alone, so pass it on as that SIGINT to our children in our own process group (servers run in
    sessions of their own and are stopped apart; the group itself may be our caller's)."""
    try:
        import psutil
        me, group = os.getpid(), os.getpgrp()
        for child in psutil.Process(me).children():
            try:
                if os.getpgid(child.pid) == group:
                    child.send_signal(signal.SIGINT)
            except (psutil.Error, OSError):
                continue
    except Exception:  # noqa: BLE001 -- a signal handler must not fail; the children end with us anyway
        pass


def requested() -> bool:
    return bool(_GOT)


def signal_name() -> str:
    return signal.Signals(_GOT[0]).name if _GOT else "SIGINT"


def exit_code() -> int:
    """128 + the signal, as a shell reports a process that signal ended (130: Ctrl-C)."""
    return 128 + (_GOT[0] if _GOT else signal.SIGINT)


def stopped_word() -> str:
    """How a summary says the run ended early: "terminated" (SIGTERM) or "interrupted" (Ctrl-C)."""
    return "terminated" if _GOT and _GOT[0] == signal.SIGTERM else "interrupted"


def refuse_start(what: str) -> None:
    """Called before starting a server: once a stop was asked for, nothing starts again."""
    if _GOT:
        raise KeyboardInterrupt(f"{stopped_word()} by {signal_name()}: {what} not started")
