"""A private, patched copy of the installed SGLang package, for the overlap-on server of a pair
(built by harness.targets.vllm.patched_copy.build_copy, as vLLM's is; its notes on hard links apply here too):

    <cache>/sglang/patched/<patch>[+<patch>...]/sglang/...

Only the patched files are real files; the rest are links into SGLang's venv, which is never
written. A stamp of the patched files' hashes rebuilds a stale copy.
"""
from __future__ import annotations

from pathlib import Path

from harness.agents.sglang_patches import PATCHES, PatchError, apply
from harness.targets.sglang import setup as sglang_setup
from harness.targets.vllm.patched_copy import build_copy, fingerprint, package_in, patched_sources


def installed_package(home: Path | None = None) -> Path:
    return package_in(home or sglang_setup.sglang_home(), "sglang", "overlap-harness setup sglang", PatchError)


def ensure_copy(names, home: Path | None = None) -> Path:
    """The folder to put first on the overlap-on server's PYTHONPATH (its `sglang` shadows the
    installed one). PatchError (one line) when a patch does not apply."""
    names = sorted(set(names))
    if not names:
        raise ValueError("ensure_copy needs at least one patch")
    home = home or sglang_setup.sglang_home()
    pkg = installed_package(home)
    # first: a patch that does not apply builds nothing
    sources = patched_sources(names, pkg, PATCHES, apply, "SGLang", PatchError)
    return build_copy(pkg, home / "patched" / "+".join(names), sources, fingerprint(names, pkg, PATCHES),
                      f"SGLang patch {'+'.join(names)}", PatchError)
