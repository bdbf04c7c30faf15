"""The SGLang target's setup: SGLang's own venv, the model directory, the agent's entry point.

`overlap-harness setup sglang`. Like vLLM (harness/targets/vllm/setup.py), SGLang lives in a venv
of its own under the cache folder (`$OVERLAP_HARNESS_CACHE/sglang/venv`), and this project is
installed there without dependencies only for its `sglang.srt.plugins` entry point.

On a CPU (no CUDA device): sglang 0.5.23 pins torch==2.14.1 and a long list of CUDA packages
(flashinfer, sglang-kernel, cuda-python, nvidia-*). Its CPU backend (`--device cpu`,
SGLANG_USE_CPU_ENGINE=1) needs none of them on a CPU without AMX but its kernel package's CPU
ops, so the venv gets: the local CPU torch 2.13.0, the sglang wheel without dependencies, its
light runtime requirements at the release's own pins (LIGHT_REQUIREMENTS, read from the wheel's
metadata), torchvision without dependencies (SGLang imports it at import time), and the
servers get harness/targets/sglang/cpu_path first on their PYTHONPATH (see its README).
On a GPU: `pip install sglang==0.5.23` as the release ships.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness.cache import cache_root
from harness.targets.vllm.setup import (CPU_TORCH, SetupError, has_cuda, model_ok, read_stamp, run_checked, announce_step,
                                        ensure_agent, venv_python, write_model_dir)

ROOT = Path(__file__).resolve().parents[3]
SGLANG = "sglang==0.5.23"  # the agent's points were written against this source (agents.sglang.points)
CPU_PATH = Path(__file__).resolve().parent / "cpu_path"
TORCHVISION_NO_DEPS = "torchvision==0.28.0"  # the index's build for torch 2.13 (CUDA-built: see cpu_path)
# what the server, the scheduler and a Llama model import on the CPU path; versions come from the
# release's own requirements (the pins there), so a new release brings its own
LIGHT_REQUIREMENTS = (
    "aiohttp", "blobfile", "compressed-tensors", "distro", "einops", "fastapi", "gguf", "interegular", "IPython",
    "llguidance", "msgspec", "numpy", "openai", "openai-harmony", "orjson", "packaging", "partial_json_parser",
    "pillow", "prometheus-client", "psutil", "pybase64", "pydantic", "python-dateutil", "python-multipart",
    "pyzmq", "regex", "requests", "scipy", "sentencepiece", "setproctitle", "soundfile", "tiktoken", "tokenizers", "tqdm",
    "transformers", "uvicorn", "uvloop", "watchfiles", "xgrammar", "xxhash", "zstandard")
# imported by SGLang but not in its requirements (they come with `datasets`, which is not needed)
EXTRA_REQUIREMENTS = ("dill", "huggingface_hub", "jsonschema", "safetensors")
STAMP = "setup.json"
FORMAT = 1
MODEL = "smollm2-135m-instruct"

_REQUIREMENTS = """
import sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
keep = {n.lower().replace("_", "-") for n in sys.argv[1].split(",")}
for r in requires("sglang") or []:
    q = Requirement(r)
    if q.marker is not None and not q.marker.evaluate({"extra": ""}):
        continue
    if q.name.lower().replace("_", "-") in keep:
        print(str(q).split(";")[0])
"""


def sglang_home(root: Path | None = None) -> Path:
    return (root or cache_root()) / "sglang"


def model_dir(home: Path, name: str | None = None) -> Path:
    """SmolLM2 (the default), or "arith": our fixture in Hugging Face form (harness.targets.hf_export),
    which answers GSM8K-format questions, so the GSM8K gate can see SGLang's accuracy move."""
    if name == "split":  # SmolLM2 cut so that two ranks divide its heads (harness.targets.split_model)
        from harness.targets.split_model import NAME
        return home / "models" / NAME
    return home / "models" / ("arith" if name == "arith" else MODEL)


def cpu_env(env: dict) -> dict:
    """What an SGLang process needs to take the CPU path here (server and import check alike)."""
    import os
    env = dict(env)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(CPU_PATH) + (os.pathsep + rest if rest else "")
    return env


IMPORT_CHECK = ("import torch, sglang.srt.managers.scheduler, sglang.srt.entrypoints.http_server, "
                "sglang.srt.layers.attention.torch_native_backend; print(torch.__version__)")


def setup_sglang(home: Path | None = None, force: bool = False, cuda: bool | None = None, models: bool = True) -> dict:
    """Make (or confirm) SGLang's venv and the model directory; returns the stamp. `models=False`:
    the venv and the agent only (the standard library: any Python 3 runs them), as setup_vllm."""
    import os
    home = home or sglang_home()
    cuda = has_cuda() if cuda is None else cuda
    py = venv_python(home)
    n = 4
    want = {"format": FORMAT, "package": SGLANG, "device": "cuda" if cuda else "cpu"}
    stamp = read_stamp(home)
    if not force and all(stamp.get(k) == v for k, v in want.items()) and py.exists() and stamp.get("venv_ok"):
        print(f"[1-2/{n}] SGLang venv ready: {home / 'venv'} ({SGLANG}, {want['device']})", file=sys.stderr)
    else:
        t0 = announce_step(1, n, f"creating the venv {home / 'venv'}")
        if force and (home / "venv").exists():
            shutil.rmtree(home / "venv")
        home.mkdir(parents=True, exist_ok=True)
        if not py.exists():
            run_checked([sys.executable, "-m", "venv", str(home / "venv")], "creating the venv")
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        if cuda:
            announce_step(2, n, f"installing {SGLANG} (its CUDA build and pins: several GB)")
            run_checked(pip + [SGLANG], f"installing {SGLANG}")
            env = dict(os.environ)
        else:
            announce_step(2, n, f"installing {CPU_TORCH} (CPU), {SGLANG} without dependencies, its light requirements")
            run_checked(pip + [CPU_TORCH], f"installing {CPU_TORCH}")
            run_checked(pip + ["--no-deps", SGLANG], f"installing {SGLANG} without dependencies")
            reqs = subprocess.run([str(py), "-c", _REQUIREMENTS, ",".join(LIGHT_REQUIREMENTS)], capture_output=True,
                                  text=True)
            if reqs.returncode != 0:
                raise SetupError(f"reading {SGLANG}'s requirements failed: {reqs.stderr.strip()[-200:]}")
            req_file = home / "requirements.txt"
            # + wheel: the agent's editable install without build isolation (ensure_agent) needs it
            req_file.write_text("\n".join(reqs.stdout.split() + list(EXTRA_REQUIREMENTS) + ["wheel"]) + "\n")
            run_checked(pip + ["-r", str(req_file)], f"installing {SGLANG}'s light requirements")
            run_checked(pip + ["--no-deps", TORCHVISION_NO_DEPS], f"installing {TORCHVISION_NO_DEPS}")
            env = cpu_env(os.environ)
        p = subprocess.run([str(py), "-c", IMPORT_CHECK], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            last = [ln for ln in p.stderr.splitlines() if ln.strip()]
            raise SetupError(f"{SGLANG} does not import in its venv ({want['device']}): "
                             f"{last[-1] if last else 'exit ' + str(p.returncode)}")
        if not cuda and not p.stdout.strip().startswith(CPU_TORCH.split("==")[1]):
            raise SetupError(f"a requirement replaced the CPU torch: the venv has torch {p.stdout.strip()}")
        seconds = time.perf_counter() - t0
        print(f"      done in {seconds:.0f} s", file=sys.stderr)
        stamp = {**want, "venv_ok": True, "install_s": round(seconds)}
        (home / STAMP).write_text(json.dumps(stamp, indent=1))
    ensure_agent(home, force, label=f"[3/{n}]", engine="SGLang")
    stamp = read_stamp(home)
    if not models:
        return stamp
    md = model_dir(home)
    if force or not model_ok(md):
        announce_step(4, n, f"writing the SmolLM2 model directory {md}")
        write_model_dir(md)
    else:
        print(f"[4/{n}] model directory ready: {md}", file=sys.stderr)
    from harness.targets.hf_export import arith_dir_current, write_arith_dir
    if force or not arith_dir_current(model_dir(home, "arith")):  # the GSM8K gate's pair (a few MB)
        write_arith_dir(model_dir(home, "arith"))
    from harness.targets import split_model  # the model TP=2 can split (issue 45: --configs tp2)
    split_model.ensure(md, model_dir(home, "split"), force, log=lambda line: print(line, file=sys.stderr))
    stamp["model_dir"] = str(md)
    (home / STAMP).write_text(json.dumps(stamp, indent=1))
    return stamp


def ready(home: Path | None = None) -> str | None:
    """None when `setup sglang` has been run, else why not (one line)."""
    home = home or sglang_home()
    stamp = read_stamp(home)
    if not stamp.get("venv_ok") or not venv_python(home).exists():
        return f"no SGLang venv in {home}: run `overlap-harness setup sglang`"
    if not model_ok(model_dir(home)):
        return f"no model directory in {model_dir(home)}: run `overlap-harness setup sglang`"
    return None


def installed(home: Path | None = None) -> dict:
    """The stamp of a finished setup ({} when there is none)."""
    home = home or sglang_home()
    return read_stamp(home) if ready(home) is None else {}
