"""First on a vLLM server's PYTHONPATH where the target runs vLLM's V2 model runner on a CPU build
(harness.targets.vllm.build.needs_triton_shim): Python imports this module at start, before vLLM.

vLLM counts Triton usable on its CPU build only when triton has a `cpu` backend (triton-cpu, not
on the package index): `vllm/triton_utils/importing.py` sets HAS_TRITON false, and V2 (whose
kernels are Triton's) is then off. With TRITON_INTERPRET=1 Triton runs those kernels in its
interpreter on CPU tensors, so HAS_TRITON is set back to true once that module has run, before
anything reads it. Nothing in the user's environment is changed; without
OVERLAP_HARNESS_HAS_TRITON=1 this module only hands over to the environment's own sitecustomize.
"""
import importlib.abc
import importlib.util
import importlib.machinery
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_MODULE = "vllm.triton_utils.importing"


class _KeepTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module

                def exec_module(module, _run=run):
                    _run(module)
                    module.HAS_TRITON = True  # Triton's interpreter runs V2's kernels here
                spec.loader.exec_module = exec_module
                return spec
        return None


if os.environ.get("OVERLAP_HARNESS_HAS_TRITON") == "1" and os.environ.get("TRITON_INTERPRET") == "1":
    sys.meta_path.insert(0, _KeepTriton())

# the environment's own sitecustomize, which this one shadows on the path
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _HERE])
if _spec is not None and _spec.loader is not None and os.path.dirname(os.path.abspath(_spec.origin or "")) != _HERE:
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
