"""A private, patched copy of the installed vLLM package, for the async-on server of a pair.

The copy is a hard-link tree (`cp -al`) of the whole package in our cache, with only the
patched files replaced by real files: a hard link costs no disk and keeps every data file and
compiled extension where vLLM looks for it, while a copy of only the patched modules would need
an import hook in every one of vLLM's processes. The user's install is never written: a patched
file is unlinked in the copy before its new text is written (writing through the link would
change the installed file), and Python writes bytecode by atomic rename, never in place.

    ~/.cache/overlap-harness/vllm/patched/<patch>[+<patch>...]/vllm/...

A stamp records the installed files' hashes; a copy that no longer matches (vLLM reinstalled,
a patch text changed) is rebuilt (about a second).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

from harness.targets.vllm import setup as setup_cmd
from harness.agents.vllm.patches import PATCHES, PatchError, apply

STAMP = "patched.json"


def installed_package(home: Path | None = None) -> Path:
    """The vllm package directory inside the setup venv."""
    return package_in(home or setup_cmd.vllm_home(), "vllm", "overlap-harness setup vllm", PatchError)


def package_in(home: Path, name: str, setup: str, error=PatchError) -> Path:
    """The package `name` inside `home`'s venv (vLLM's, SGLang's), or `error` naming the setup."""
    found = sorted((home / "venv" / "lib").glob(f"python*/site-packages/{name}/__init__.py"))
    if not found:
        raise error(f"no {name} package in {home / 'venv'}: run `{setup}`")
    return found[-1].parent


def patched_sources(names, pkg: Path, patches=None, apply_patch=None, label: str = "vLLM",
                    error=PatchError) -> dict[str, str]:
    """file (relative to the package) -> its text with every named patch applied (vLLM's patches
    unless an engine gives its own catalogue and apply)."""
    patches, apply_patch = patches or PATCHES, apply_patch or apply
    out: dict[str, str] = {}
    for name in sorted(names):
        p = patches[name]
        if p.file not in out:
            try:
                out[p.file] = (pkg / p.file).read_text()
            except OSError as e:
                raise error(f"{label} patch {name}: cannot read {pkg.name}/{p.file}: {e.strerror}") from None
        out[p.file] = apply_patch(p, out[p.file])
    return out


def fingerprint(names, pkg: Path, patches=None) -> dict:
    """What a patched copy is built from: the patches' texts and the installed files they change."""
    patches = patches or PATCHES
    h = hashlib.sha256()
    for n in sorted(names):
        p = patches[n]
        h.update(f"{p.name}\0{p.file}\0{p.edits}\0".encode())
    for f in sorted({patches[n].file for n in names}):
        h.update((pkg / f).read_bytes())
    init = pkg / "__init__.py"
    return {"patches": sorted(names), "package": str(pkg), "hash": h.hexdigest(),
            "init_mtime": init.stat().st_mtime_ns}


def _link_tree(src: Path, dst: Path) -> None:
    """Hard links where the cache and the venv share a file system, symbolic links otherwise."""
    for flag in ("-al", "-as"):
        shutil.rmtree(dst, ignore_errors=True)
        if subprocess.run(["cp", flag, str(src), str(dst)], capture_output=True).returncode == 0:
            return
    raise PatchError(f"cannot make a linked copy of {src} in {dst.parent}")


def ensure_copy(names, home: Path | None = None, pkg: Path | None = None) -> Path:
    """The folder to put first on the async-on server's PYTHONPATH: it holds a `vllm` package
    with the named patches applied. PatchError (one line) when a patch does not apply. `pkg`: the
    vllm package to copy (an overlay's, a user's: never written into), else the setup venv's;
    the copy lives under `home` (our cache) either way."""
    names = sorted(set(names))
    if not names:
        raise ValueError("ensure_copy needs at least one patch")
    home = home or setup_cmd.vllm_home()
    pkg = Path(pkg) if pkg else installed_package(home)
    sources = patched_sources(names, pkg)  # first: a patch that does not apply builds nothing
    return build_copy(pkg, home / "patched" / "+".join(names), sources, fingerprint(names, pkg),
                      f"vLLM patch {'+'.join(names)}", PatchError)


def build_copy(pkg: Path, root: Path, sources: dict[str, str], want: dict, label: str, error=PatchError) -> Path:
    """`root`/<package> as a linked copy of the installed package `pkg` with `sources` (file relative
    to the package -> its patched text) written as real files; reused while its stamp equals `want`.
    One builder for every engine's patched copy (vLLM here, SGLang: harness.targets.sglang.patched_copy)."""
    package = pkg.name
    try:
        if json.loads((root / STAMP).read_text()) == want and (root / package / "__init__.py").exists():
            return root
    except (OSError, ValueError):
        pass
    tmp = root.with_name(root.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _link_tree(pkg, tmp / package)
        for rel, text in sources.items():
            target = tmp / package / rel
            os.unlink(target)  # drop the link first: writing through it would change the install
            target.write_text(text)
            cache = target.parent / "__pycache__"
            for pyc in (cache.glob(f"{target.stem}.*.pyc") if cache.is_dir() else ()):
                os.unlink(pyc)  # the installed module's bytecode: recompiled from the patched text
            if (pkg / rel).read_text() == text:
                raise error(f"{label}: {package}/{rel} unchanged")
        (tmp / STAMP).write_text(json.dumps(want, indent=1))
        shutil.rmtree(root, ignore_errors=True)
        os.replace(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def server_pythonpath(pythonpath: str | None, names, home: Path | None = None, pkg: Path | None = None) -> str:
    """A server's PYTHONPATH with the patched copy first: its `vllm` shadows the installed one
    (site-packages comes after every PYTHONPATH entry); the copy holds nothing else, so the agent
    is still imported from our checkout further along."""
    copy = str(ensure_copy(names, home, pkg))
    return copy + (os.pathsep + pythonpath if pythonpath else "")
