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
