"""The one cache folder every part of the harness shares (vLLM's venv and models, the SGLang
wheel, the batch-invariance verdicts): a module of its own so that the engine can use it
without importing the targets' setup code."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    env = os.environ.get("OVERLAP_HARNESS_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "overlap-harness"


def file_sha256(path: str | os.PathLike) -> str:
    """The hex SHA-256 of a file's contents, read in 4 MiB pieces (a model's weights do not fit
    in memory twice): the checksum every cached or shipped file is checked by."""
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()
