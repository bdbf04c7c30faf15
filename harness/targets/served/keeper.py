"""Runs a server as its child and takes the server's whole process group down with it.

The target starts `python -m harness.targets.served.keeper CMD...` in a new session, with a
parent-death signal: however the target ends, even by SIGKILL, the keeper gets SIGTERM and
ends every process of the group (the server and what it spawned: vLLM's engine core and
worker), SIGKILL after a grace period. Without it, a killed target leaves a server's children
running, since the kernel signals only a direct child of the dead process. Given
`--orphan-remove DIR --` before the command, a keeper whose target died removes DIR (the
target's temporary work folder) after the group is down: a killed run leaves nothing behind.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

GRACE_S = 8.0


def main(argv: list[str]) -> int:
    orphan_dir = None
    if argv[:1] == ["--orphan-remove"]:  # --orphan-remove DIR -- CMD...
        orphan_dir, argv = argv[1], argv[3:]
    parent = os.getppid()
    child = subprocess.Popen(argv)
    group = os.getpgrp()

    def end(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the killpg below reaches us too
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + GRACE_S
        while not _exited(child.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # let the server's own children finish their shutdown
        if orphan_dir and os.getppid() != parent:
            # the target died (SIGKILL, or it never reached its cleanup): nobody else removes its
            # temporary work folder. Not on a plain stop: the target still uses the folder then
            shutil.rmtree(orphan_dir, ignore_errors=True)
        os.killpg(group, signal.SIGKILL)  # whatever is left, ourselves included

    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGINT, end)
    code = child.wait()
    # the server ended by itself: what it left behind in the group goes with it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        pass
    return code


def _exited(pid: int) -> bool:
    """Whether the child has ended. Not Popen.poll(): this runs in a signal handler that
    interrupted child.wait(), which holds the Popen's wait lock, so poll() answers None until
    the grace period is over (every stop took GRACE_S longer than the server needed)."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
