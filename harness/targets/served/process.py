"""The server processes a served target starts: free ports on 127.0.0.1, a start through the
keeper (harness.targets.served.keeper) in a process group of its own, a health wait that notices a server
that died, and every server stopped on every exit path (a normal end, an exception, Ctrl-C,
SIGTERM, and the parent dying: PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import atexit
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from harness.targets.base import TargetUnavailable
from harness.targets.served.log import _log_body, _untagged_line_before, engine_traceback, exception_line

_LIVE: set["ServerProcess"] = set()
_LOCK = threading.Lock()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    """preexec_fn: the child gets SIGTERM when we die, even by SIGKILL (Linux only)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class ServerProcess:
    def __init__(self, name: str, cmd: list[str], env: dict, log_path: Path, cwd: Path | None = None,
                 orphan_dir: Path | None = None):
        self.name, self.cmd, self.log_path = name, cmd, log_path
        self.port = None
        self._log = open(log_path, "wb")
        # through the keeper: it takes the server's whole group down, even when we are killed, and
        # then removes `orphan_dir` (our temporary work folder) when we died without doing it
        orphan = ["--orphan-remove", str(orphan_dir), "--"] if orphan_dir else []
        cmd = [sys.executable, "-m", "harness.targets.served.keeper", *orphan, *cmd]
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd,
                                     preexec_fn=_die_with_parent)
        with _LOCK:
            _LIVE.add(self)

    def log_tail(self, n: int = 3) -> str:
        """Why a server did not come up: its traceback's exception line; else its first ERROR
        line (a WARNING that names an error, vLLM's ulimit one, is no cause); else its last lines."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        starts = [i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln]
        if starts:
            tb = engine_traceback(self.log_path)  # its last lines: the start may be cut off
            why = exception_line(tb)[:300]
            if "(EngineCore" not in tb:  # the API server's: it only says the engine died
                cause = _untagged_line_before(lines, starts[-1])
                if cause:  # an engine that died in native code leaves no traceback, only this
                    why += f" (before it: {cause[:200]})"
            return why
        keep = [ln for ln in lines if ln.strip() and not re.search(r"\b(WARNING|INFO|DEBUG)\b", ln)]
        errors = [ln for ln in keep if "Error:" in ln or "ERROR" in ln]
        if errors:  # the root cause, not the last line of the traceback that followed it
            return _log_body(errors[0]).strip()[-300:]
        return " | ".join(_log_body(ln).strip()[-200:] for ln in (keep or lines)[-n:])

    def wait_healthy(self, url: str, timeout: float) -> None:
        import httpx
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TargetUnavailable(f"{self.name} exited with code {self.proc.returncode} while starting "
                                        f"(log {self.log_path}): {self.log_tail()}")
            try:
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TargetUnavailable(f"{self.name} not healthy after {timeout:.0f} s (log {self.log_path}): "
                                f"{self.log_tail()}")

    def ask_to_stop(self) -> None:
        """SIGTERM to the whole process group, without waiting (stop_each waits for them all)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to the whole process group, SIGKILL after `grace` seconds."""
        p = self.proc
        if p.poll() is None:
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:  # children that outlived their leader (an engine core, a worker)
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._log.close()
        with _LOCK:
            _LIVE.discard(self)


def stop_each(servers, grace: float = 10.0) -> None:
    """Stop several servers at once: each gets SIGTERM first, then each is waited for (the grace
    counts from the first signal), so their shutdowns overlap instead of adding up."""
    servers = list(servers)
    for s in servers:
        s.ask_to_stop()
    deadline = time.monotonic() + grace
    for s in servers:
        s.stop(grace=max(0.0, deadline - time.monotonic()))


def stop_all(grace: float = 5.0) -> None:
    with _LOCK:
        live = list(_LIVE)
    stop_each(live, grace=grace)


atexit.register(stop_all)


def install_sigterm_handler() -> None:
    """SIGTERM (a CI cancellation, `timeout`) ends the run as Ctrl-C does and stops our servers
    (harness/stopping.py); only where nobody else handles it (the CLI installed it already; a
    plain `pytest --oh-target vllm` gets it here), and only from the main thread."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        from harness import stopping
        stopping.install()
