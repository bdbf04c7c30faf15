"""Reading a server's log: the engine core's traceback and its exception line, for a CRASH
report and for why a server did not come up. vLLM's logs tag each line with its process
("(EngineCore_DP0 pid=9) "), may colour the tag, and its logger writes a traceback with the
record's prefix on every line; these readers see through all three.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple


def log_body(line: str) -> str:
    """A log line without vLLM's process tag ("(EngineCore_DP0 pid=9) ") nor its colours (older
    releases colour the tag even in a log file)."""
    return re.sub(r"^\([^)]*pid=\d+\)\s?", "", _ANSI.sub("", line))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TAG = re.compile(r"^\([^)]*pid=\d+\)")


def _tag(line: str) -> str:
    """The process tag of a log line ("(EngineCore_DP0 pid=9)"), or ""."""
    m = _TAG.match(_ANSI.sub("", line))
    return m.group(0) if m else ""


_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)?(:|$)")
_LOG_PREFIX = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
# a traceback vLLM's logger wrote (logger.exception: its multiproc worker, the async engine core)
# carries the record's prefix on every line: "ERROR 12-04 00:08:32 [core.py:710] "
_RECORD = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL) [\d-]+ [\d:.]+ \[[^\]]*\] ")


class _Traceback(NamedTuple):
    lines: list[str]
    complete: bool  # ends on an exception line, not cut by a log line or by the process's exit
    proc: str  # the engine core's or worker's process tag, or "" (another process: the API server)
    down: bool  # written inside a shutdown


def _tracebacks(lines: list[str]) -> list[_Traceback]:
    """Each traceback in a log's lines, in order."""
    out = []
    for st in (i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln):
        block, complete = [lines[st]], False
        rec = _RECORD.match(log_body(lines[st]))
        tag = _tag(lines[st])
        for ln in lines[st + 1:]:
            if tag and _tag(ln) and _tag(ln) != tag:
                continue  # another process's line written between ours (the API server's own traceback)
            block.append(ln)
            body = log_body(ln)
            if rec is not None:  # a logged traceback: its lines carry the same record prefix
                if not body.startswith(rec.group(0)):
                    break  # cut by another record
                body = body[rec.end():]
            if body and not body.startswith((" ", "\t")):
                complete = bool(_EXC_LINE.match(body)) and not _LOG_PREFIX.match(body)
                break  # the exception line (or whatever cut the traceback) closes it
        # a worker's traceback from inside its shutdown follows the engine core's death, it is not
        # its cause (0.20.2 with a CUDA torch: the worker's cleanup asks for an NVIDIA driver after the
        # engine core's assertion, and the CRASH was read as "Found no NVIDIA driver")
        down = any(_IN_SHUTDOWN.search(_RECORD.sub("", log_body(ln))) for ln in block)
        # the engine core's or a worker's: "(EngineCore_DP0 pid=9)", "(Worker pid=9)", and a rank's
        # own under TP or PP, "(Worker_PP0 pid=9)", "(Worker_TP1 pid=9)"
        engine = _ENGINE_TAG.match(_tag(lines[st]))
        out.append(_Traceback(block, complete, engine.group(1) if engine else "", down))
    return out


_ENGINE_TAG = re.compile(r"^\((EngineCore\w*|Worker\w*) pid=\d+\)")


def engine_traceback(log_path: Path, limit: int = 40) -> str:
    """The engine core's traceback in a server's log, at most `limit` lines, ending with its
    exception line; else the log's last error line. A complete traceback is preferred, and of those
    the last one a vLLM engine-core or worker process wrote (the API server's own traceback,
    which follows it, only says the engine died); else the last complete one; else the last one."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    blocks = _tracebacks(lines)
    if not blocks:
        errs = [ln for ln in lines if "Error" in ln or "ERROR" in ln]
        return errs[-1].strip() if errs else ""
    whole = [b for b in blocks if b.complete]
    pick = ([b for b in whole if b.proc and not b.down] or [b for b in whole if b.proc] or whole or blocks)[-1].lines
    return "\n".join(pick[-limit:])


def process_raised(log_path: Path, since: int = 0) -> str:
    """"<process>: <exception line>" of the first complete traceback an engine core or worker process
    wrote past byte `since` of a server's log, outside a shutdown; "" when none did. For a HANG: vLLM's
    executor reads the replies of the output rank only, so a rank that raised (pipeline stage 0) leaves
    the engine waiting, with its traceback in the log as the only trace."""
    try:
        with open(log_path, "rb") as f:
            f.seek(since)
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for b in _tracebacks(lines):
        if b.complete and b.proc and not b.down:
            return f"{b.proc}: {exception_line(chr(10).join(b.lines))[:300]}"
    return ""


_IN_SHUTDOWN = re.compile(r'^\s*File "[^"]*", line \d+, in shutdown$')


def untagged_line_before(lines: list[str], end: int, look: int = 5) -> str:
    """The last line among the `look` before lines[end] that is no log record (a native
    library's own message, as libnuma's); "" when there is none."""
    for ln in reversed(lines[max(0, end - look):end]):
        body = log_body(ln).strip()
        if body and not _LOG_PREFIX.match(body) and not ln.startswith((" ", "\t")):
            return body
    return ""


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in ')


def exception_line(tb: str) -> str:
    """The traceback's exception line; a bare one (`AssertionError`) gets the failing source line
    and its place, which is what tells two assertions apart."""
    if not tb.strip():
        return "no traceback in its log"
    lines = [_RECORD.sub("", log_body(ln)) for ln in tb.strip().splitlines()]
    last = lines[-1].strip()
    if ":" in last:
        return last
    for i in range(len(lines) - 1, -1, -1):
        m = _FRAME.match(lines[i])
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) - 1 else ""
            return f"{last}: {code} ({os.path.basename(m.group(1))}:{m.group(2)})" if code else last
    return last
