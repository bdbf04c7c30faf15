"""JSONL input shared by the CLI's prompt files, GSM8K data files and saved per-question runs."""
from __future__ import annotations

import json
from typing import Callable, Iterator


def records(lines: list[str], path, error: Callable[[str], Exception]) -> Iterator[tuple[int, object]]:
    """(line number, parsed value) for each non-blank line; a line that is not JSON raises
    `error` with a one-line message naming the file and line."""
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{path}:{i}: not JSON ({e.msg})") from None


def read_lines(path, what: str, error: Callable[[str], Exception]) -> list[str]:
    """The lines of a UTF-8 text file; a missing, unreadable or non-UTF-8 file raises `error`
    with one line saying which and why (`what` names the flag or role: "--prompts")."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except UnicodeDecodeError as e:
        raise error(f"cannot read {what} {path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                    f"{e.start})") from None
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}") from None
