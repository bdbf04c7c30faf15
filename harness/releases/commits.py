"""`bisect --vllm-python PY --good REV --bad REV --replay FILE`: the upstream commit where a
reproducer starts failing, in the git checkout that PY's vLLM is imported from (an editable
install: `pip install -e`).

git bisect does the search; each step runs `overlap-harness replay FILE --vllm-python PY`, whose
exit codes are git bisect run's: 0 good, 1 bad, 125 cannot test (the servers did not start, the
agent cannot attack that commit). Only the checkout's Python changes between steps: an editable
install's compiled parts are the ones built last, so a commit whose C++ / CUDA sources differ
from those is tested with the old library (docs/vllm-builds.md says so). The checkout must be
clean (git bisect moves its HEAD; a dirty tree would be carried into every step), and it is put
back where it was (`git bisect reset`) whatever happens.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def _git(top: Path, *args, check=True, timeout=120) -> str:
    p = subprocess.run(["git", "-C", str(top), *args], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise ValueError(f"git {' '.join(args)}: {(p.stderr.strip().splitlines() or ['failed'])[-1]}")
    return p.stdout.strip()


def checkout_of(build) -> Path:
    """The git work tree holding the vLLM package `build` imports; ValueError (one line) when it
    is not in one, or the tree has changes of its own."""
    pkg = Path(build.checkout or build.package or "")
    if not pkg or not pkg.exists():
        raise ValueError(f"cannot tell where {build.python}'s vllm lives")
    try:
        top = Path(_git(pkg if pkg.is_dir() else pkg.parent, "rev-parse", "--show-toplevel"))
    except (ValueError, OSError):
        raise ValueError(f"{build.python}'s vllm ({pkg}) is not in a git checkout: install one with "
                         "`pip install -e` from a clone to bisect its commits") from None
    if _git(top, "status", "--porcelain", "--untracked-files=no"):
        raise ValueError(f"the checkout {top} has uncommitted changes: commit or stash them first "
                         "(git bisect would carry them into every commit)")
    return top


def bisect(top: Path, good: str, bad: str, replay_cmd: list[str], timeout: float) -> tuple[str, str]:
    """(first bad commit or "", git bisect's last lines) between good and bad."""
    for rev in (good, bad):
        _git(top, "rev-parse", "--verify", f"{rev}^{{commit}}")
    _git(top, "bisect", "start", bad, good)
    try:
        p = subprocess.run(["git", "-C", str(top), "bisect", "run", *replay_cmd], capture_output=True, text=True,
                           timeout=timeout)
        out = p.stdout + p.stderr
        m = re.search(r"^([0-9a-f]{7,40}) is the first bad commit", out, re.M)
        return (m.group(1) if m else ""), "\n".join(out.strip().splitlines()[-8:])
    finally:
        _git(top, "bisect", "reset", check=False)


def replay_command(replay: str, vllm_python: str, runner: str) -> list[str]:
    cmd = [sys.executable, "-m", "harness.cli", "replay", str(Path(replay).resolve()), "--target", "vllm",
           "--vllm-python", vllm_python]
    return cmd + (["--vllm-runner", runner] if runner != "auto" else [])
