"""Signals during a search: SIGTERM ends it as Ctrl-C does, and is held off while a finding is written."""
from __future__ import annotations

import contextlib
import signal
import threading

from harness import stopping


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While inside, SIGTERM ends the search as Ctrl-C does (KeyboardInterrupt, which the search
    turns into 'interrupted, keep what was found'); yields a list that is non-empty once it came."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield got
        return

    def handler(signum, frame):
        if not got:
            got.append(signum)
            stopping.note(signum)  # no server starts again; those running stop now
            raise KeyboardInterrupt
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield got
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def sigterm_deferred():
    """While inside (writing what was found), SIGTERM is noted, not obeyed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
