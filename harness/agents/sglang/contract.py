"""Check SGLang's source against the agent's patch points, without importing SGLang.

`fetch_source()` downloads the sglang wheel with `pip download --no-deps` into our cache
folder and unpacks its Python files; `check_source(root)` parses them with `ast` and returns
one line per broken promise, each naming the symbol and what uses it. When SGLang renames or
reshapes a patch point, this says which one on a CPU, not a GPU run weeks later.
"""
from __future__ import annotations

import ast
import fcntl
import subprocess
import sys
import zipfile
from pathlib import Path

# the engine-neutral readers, under this module's old names (its checks below call them so)
from harness.agents.engine_source import find_def as _find
from harness.agents.engine_source import parse_module as _parse
from harness.agents.sglang.points import CATALOGUE, CONSTANTS, DELAY_POINTS, POINTS, SERVER_FIELDS, WRITTEN_AGAINST


class SourceUnavailable(Exception):
    pass


def cache_root() -> Path:
    """The one cache folder every target shares (harness.cache.cache_root)."""
    from harness.cache import cache_root as shared
    return shared()


def fetch_source(version: str = WRITTEN_AGAINST, cache: Path | None = None, timeout: float = 600) -> Path:
    """The unpacked Python source of sglang==version (downloaded once, then cached)."""
    base = (cache or cache_root()) / "sglang"
    src = base / f"src-{version}"
    if (src / ".complete").exists():
        return src
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers: one downloads, the others wait
        if (src / ".complete").exists():
            return src
        return _download_and_unpack(version, base, src, timeout)


def _download_and_unpack(version: str, base: Path, src: Path, timeout: float) -> Path:
    wheels = sorted(base.glob(f"sglang-{version}-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
               "--disable-pip-version-check", "-d", str(base), f"sglang=={version}"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SourceUnavailable(f"pip download sglang=={version} failed: {e}") from None
        wheels = sorted(base.glob(f"sglang-{version}-*.whl"))
        if r.returncode != 0 or not wheels:
            last = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise SourceUnavailable(f"pip download sglang=={version} failed (exit {r.returncode}): {last}")
    try:
        with zipfile.ZipFile(wheels[-1]) as z:
            names = [n for n in z.namelist() if n.startswith("sglang/") and n.endswith(".py")]
            z.extractall(src, names)
    except (OSError, zipfile.BadZipFile) as e:
        raise SourceUnavailable(f"cannot unpack {wheels[-1]}: {e}") from None
    (src / ".complete").write_text(wheels[-1].name + "\n")
    return src


def _users(point_name: str) -> str:
    uses = [f"fault {f.name}" for f in CATALOGUE.values() if f.point == point_name]
    if point_name in DELAY_POINTS:
        uses.append(f"delay {point_name}")
    return ", ".join(uses) or f"agent point {point_name}"


def check_source(root: Path) -> list[str]:
    """One line per patch point that is missing or no longer has the shape the agent expects."""
    root = Path(root)
    trees: dict = {}
    problems = []
    for p in POINTS:
        sym = f"{p.module}:{p.qualname}"
        tree = _parse(root, p.module, trees)
        if tree is None:
            problems.append(f"{sym}: module {p.module} not found (used by {_users(p.name)})")
            continue
        fn = _find(tree, p.qualname)
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            problems.append(f"{sym}: not found (used by {_users(p.name)})")
            continue
        got = tuple(a.arg for a in fn.args.posonlyargs + fn.args.args)
        if got[:len(p.params)] != p.params:
            problems.append(f"{sym}: parameters {got} do not start with {p.params} (used by {_users(p.name)})")
        names = {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)}
        names |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
        missing = [r for r in p.refs if r not in names]
        if missing:
            problems.append(f"{sym}: no longer mentions {', '.join(missing)} (used by {_users(p.name)})")
    for module, name, value in CONSTANTS:
        tree = _parse(root, module, trees)
        vals = [n.value for n in (tree.body if tree else []) if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
        if not vals:
            problems.append(f"{module}:{name}: not found")
        elif not (isinstance(vals[-1], ast.Constant) and vals[-1].value == value):
            problems.append(f"{module}:{name}: is no longer {value!r}")
    for module, name in SERVER_FIELDS:
        tree = _parse(root, module, trees)
        found = tree is not None and any(isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                                         and n.target.id == name
                                         for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body)
        if not found:
            problems.append(f"{module}:{name}: server flag --{name.replace('_', '-')} not found "
                            f"(used by the sglang target)")
    return problems
