"""A private, patched copy of the installed SGLang package, for the overlap-on server of a pair
(built by harness.targets.vllm_copy.build_copy, as vLLM's is; its notes on hard links apply here too):

    <cache>/sglang/patched/<patch>[+<patch>...]/sglang/...

Only the patched files are real files; the rest are links into SGLang's venv, which is never
written. A stamp of the patched files' hashes rebuilds a stale copy.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from harness.agents.sglang_patches import PATCHES, PatchError, apply
from harness.targets import sglang_setup
from harness.targets.vllm_copy import build_copy


def installed_package(home: Path | None = None) -> Path:
    home = home or sglang_setup.sglang_home()
    found = sorted((home / "venv" / "lib").glob("python*/site-packages/sglang/__init__.py"))
    if not found:
        raise PatchError(f"no sglang package in {home / 'venv'}: run `overlap-harness setup sglang`")
    return found[-1].parent


def patched_sources(names, pkg: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in sorted(names):
        p = PATCHES[name]
        if p.file not in out:
            try:
                out[p.file] = (pkg / p.file).read_text()
            except OSError as e:
                raise PatchError(f"SGLang patch {name}: cannot read sglang/{p.file}: {e.strerror}") from None
        out[p.file] = apply(p, out[p.file])
    return out


def _fingerprint(names, pkg: Path) -> dict:
    h = hashlib.sha256()
    for n in sorted(names):
        p = PATCHES[n]
        h.update(f"{p.name}\0{p.file}\0{p.edits}\0".encode())
    for f in sorted({PATCHES[n].file for n in names}):
        h.update((pkg / f).read_bytes())
    return {"patches": sorted(names), "package": str(pkg), "hash": h.hexdigest()}


def ensure_copy(names, home: Path | None = None) -> Path:
    """The folder to put first on the overlap-on server's PYTHONPATH (its `sglang` shadows the
    installed one). PatchError (one line) when a patch does not apply."""
    names = sorted(set(names))
    if not names:
        raise ValueError("ensure_copy needs at least one patch")
    home = home or sglang_setup.sglang_home()
    pkg = installed_package(home)
    sources = patched_sources(names, pkg)  # first: a patch that does not apply builds nothing
    return build_copy(pkg, home / "patched" / "+".join(names), sources, _fingerprint(names, pkg),
                      f"SGLang patch {'+'.join(names)}", PatchError)
