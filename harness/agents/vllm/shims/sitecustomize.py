"""First on a vLLM server's PYTHONPATH where the target runs vLLM's V2 model runner on a CPU build
(harness.targets.vllm.build.needs_triton_shim), forces an ISA, or stubs ops: Python imports this
module at start, before vLLM.

vLLM counts Triton usable on its CPU build only when triton has a `cpu` backend (triton-cpu, not
on the package index): `vllm/triton_utils/importing.py` sets HAS_TRITON false, and V2 (whose
kernels are Triton's) is then off. With TRITON_INTERPRET=1 Triton runs those kernels in its
interpreter on CPU tensors, so HAS_TRITON is set back to true once that module has run, before
anything reads it. Nothing in the user's environment is changed; without
OVERLAP_HARNESS_HAS_TRITON=1 this module only hands over to the environment's own sitecustomize.

OVERLAP_HARNESS_VLLM_ISA=avx2|avx512 (harness.targets.vllm.library.isa): torch.cpu's AVX-512/AMX probes
answer false once torch.cpu is imported, so vLLM's CPU platform loads that ISA's library
(`import_kernels`) and its attention picks that ISA's kernel, as on a CPU without them.

OVERLAP_HARNESS_VLLM_STUBS={"_C::op": "why", ...} (harness.targets.vllm.library.route): after vLLM's CPU
platform has loaded its library, every named op the library lacks is stubbed (stub_ops): a call
fails naming the op and the route it was judged off. The server's log names the library loaded.
"""
import importlib.abc
import importlib.util
import importlib.machinery
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_MODULE = "vllm.triton_utils.importing"


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` once module `name` has run."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module

                def exec_module(module, _run=run):
                    _run(module)
                    self.then(module)
                spec.loader.exec_module = exec_module
                return spec
        return None


def _keep_triton(module):
    module.HAS_TRITON = True  # Triton's interpreter runs V2's kernels here


_PROBES_OFF = {"avx512": ("_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported"),
               "avx2": ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
                        "_is_amx_tile_supported", "_is_amx_fp16_supported")}  # = harness.targets.vllm.library.isa.PROBES_OFF


def _force_isa(module):
    for probe in _PROBES_OFF[os.environ["OVERLAP_HARNESS_VLLM_ISA"]]:
        if hasattr(module, probe):
            setattr(module, probe, lambda: False)


def stub_ops(space, stubs: dict) -> None:
    """Ops of torch's op namespace `space` (torch.ops._C) that its library lacks, judged off the
    served model's route: looking one up raises an AttributeError naming the op and the route, where
    torch would say only that the namespace has no such attribute. An AttributeError, as before:
    vLLM's own `hasattr(torch.ops._C, op)` guards (0.32.0 registers fakes only where the op exists)
    still see the op absent; a call of it stops at the lookup, loudly."""
    base = type(space)

    class _Stubbed(base):
        def __getattr__(self, name):
            try:
                return base.__getattr__(self, name)
            except AttributeError:
                op = f"{self.name}::{name}"
                if op not in stubs:
                    raise
                raise AttributeError(f"{op} was called, but this server's vLLM library lacks it: the overlap "
                                     f"harness stubbed it as off the served model's route ({stubs[op]}); the "
                                     "route judgement (harness/targets/vllm/library/route.py) missed a caller") from None
    space.__class__ = _Stubbed


def _loaded_library():
    """The vLLM `_C*` library this process mapped (/proc/self/maps), for the server's log."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            libs = {ln.split()[-1] for ln in f if "/vllm/_C" in ln}
    except OSError:
        return "?"
    return ", ".join(sorted(os.path.basename(x) for x in libs)) or "none"


def _after_kernels(module):
    import json
    stubs = json.loads(os.environ.get("OVERLAP_HARNESS_VLLM_STUBS") or "{}")
    cls = module.CpuPlatform
    load = cls.import_kernels.__func__

    def import_kernels(klass):
        load(klass)
        if getattr(import_kernels, "done", False):  # vLLM calls it from every module that needs the ops
            return
        import_kernels.done = True
        print(f"[overlap-harness] vLLM's compiled library in this process: {_loaded_library()}"
              + (f"; stubbed off the route: {', '.join(sorted(stubs))}" if stubs else ""), file=sys.stderr, flush=True)
        import torch
        for ns in sorted({op.split("::")[0] for op in stubs}):
            stub_ops(getattr(torch.ops, ns), stubs)
    cls.import_kernels = classmethod(import_kernels)


if os.environ.get("OVERLAP_HARNESS_HAS_TRITON") == "1" and os.environ.get("TRITON_INTERPRET") == "1":
    sys.meta_path.insert(0, _AfterImport(_MODULE, _keep_triton))
if os.environ.get("OVERLAP_HARNESS_VLLM_ISA") in _PROBES_OFF:
    sys.meta_path.insert(0, _AfterImport("torch.cpu", _force_isa))
if os.environ.get("OVERLAP_HARNESS_VLLM_STUBS") or os.environ.get("OVERLAP_HARNESS_VLLM_ISA") in _PROBES_OFF:
    sys.meta_path.insert(0, _AfterImport("vllm.platforms.cpu", _after_kernels))

# the environment's own sitecustomize, which this one shadows on the path
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _HERE])
if _spec is not None and _spec.loader is not None and os.path.dirname(os.path.abspath(_spec.origin or "")) != _HERE:
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
