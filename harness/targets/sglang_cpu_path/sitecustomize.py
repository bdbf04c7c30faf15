"""Lets the index's (CUDA-built) torchvision import beside the CPU torch: see README.md.

Runs at interpreter start in SGLang's server processes only (this folder is on their PYTHONPATH).
Importing torch here would slow every start, so a finder waits for torchvision's fake-kernel
module and declares the two operators it registers without a guard, only when torchvision's C
extension did not load (a CPU torchvision defines them itself, and then nothing is done)."""
import importlib.abc
import importlib.machinery
import sys

_TARGET = "torchvision._meta_registrations"
_SCHEMAS = {"nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
            "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold, float scale, int zero_point) -> Tensor"}


class _DeclareTorchvisionOps(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            import torch
            import torchvision.extension
            if not torchvision.extension._has_ops():
                lib = torch.library.Library("torchvision", "FRAGMENT")
                for op, schema in _SCHEMAS.items():
                    if not hasattr(torch.ops.torchvision, op):
                        lib.define(schema)
                _keep.append(lib)  # a Library object undoes its definitions when collected
            run(module)

        spec.loader.exec_module = exec_module
        return spec


_keep: list = []
sys.meta_path.insert(0, _DeclareTorchvisionOps())
