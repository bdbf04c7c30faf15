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


def _declare_torchvision_ops(module):
    import torch
    import torchvision.extension
    if not torchvision.extension._has_ops():
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for op, schema in _SCHEMAS.items():
            if not hasattr(torch.ops.torchvision, op):
                lib.define(schema)
        _keep.append(lib)  # a Library object undoes its definitions when collected


_keep: list = []


class _ModuleHooks(importlib.abc.MetaPathFinder):
    """Runs a hook of ours before (_BEFORE) or after (_AFTER) the named module's own code, the
    first time it is imported; every other module is left to the other finders."""

    def find_spec(self, name, path, target=None):
        before, after = _BEFORE.get(name), _AFTER.get(name)
        if before is None and after is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            if before is not None:
                before(module)
            run(module)
            if after is not None:
                after(module)

        spec.loader.exec_module = exec_module
        return spec


# -- SGLang's CPU graph runner on torch_native attention ------------------------------------------
_NATIVE = "sglang.srt.layers.attention.torch_native_backend"


def _graph_state(self, max_bs, max_num_tokens):
    """torch_native attention keeps no per-graph buffers: it reads req_to_token and the KV pool
    through the batch it is given, padded rows included."""


def _seq_len_fill(self):
    # a padded row attends over one position, req_to_token[0, 0]: entry 0's slot 0, reserved
    return 1


def _capture_metadata(self, bs, num_tokens, req_pool_indices, seq_lens, out_cache_loc, encoder_lens,
                      forward_mode, spec_info):
    # what init_forward_metadata derives from a batch (the sliding-window slot translation), from
    # the capture's own buffers
    if getattr(self, "use_sliding_window_kv_pool", False):
        self.swa_out_cache_loc = self.token_to_kv_pool.translate_loc_from_full_to_swa(out_cache_loc)
    else:
        self.swa_out_cache_loc = None


def _native_hooks(module):
    cls = getattr(module, "TorchNativeAttnBackend", None)
    for attr, fn in (("init_cpu_graph_state", _graph_state),
                     ("get_cpu_graph_seq_len_fill_value", _seq_len_fill),
                     ("init_forward_metadata_capture_cpu_graph", _capture_metadata)):
        if cls is not None and not hasattr(cls, attr):
            setattr(cls, attr, fn)


def _fakes_for_present_ops(module):
    # the runner registers torch.compile fakes for some fifty sgl_kernel CPU operators; no CPU build
    # of sgl-kernel exists here (sgl_kernel/ is ours, in Python, and defines no operator), and
    # registering a fake for an operator that does not exist raises. A model on the non-AMX path
    # calls none of them (forward_native layers), so a fake is registered only for one that exists
    register = getattr(module, "register_cpu_compile_fake", None)
    if register is None:
        return

    def register_cpu_compile_fake(op_name):
        import torch
        try:
            getattr(torch.ops.sgl_kernel, op_name)
        except (AttributeError, RuntimeError):
            return lambda fn: fn
        return register(op_name)
    module.register_cpu_compile_fake = register_cpu_compile_fake


_BEFORE = {_TARGET: _declare_torchvision_ops}
_AFTER = {_NATIVE: _native_hooks, "sglang.srt.model_executor.cpu_graph_runner": _fakes_for_present_ops}
# SGLang's CPU graph runner (--enable-torch-compile on device cpu: decode batches padded to a
# captured size, the padded rows on req_to_token entry 0 and KV slot 0) was written for the AMX
# path: it asks its attention backend for three CPU-graph hooks that only the AMX backend defines
# (without AMX the backend is torch_native, and the runner died at start on the first,
# AttributeError), and it registers fakes for sgl-kernel's CPU operators, which do not exist here
# (RuntimeError). _native_hooks gives the hooks to torch_native (nothing, a fill of 1, the
# metadata), only where the installed class lacks them, and _fakes_for_present_ops registers fakes
# for the operators that exist. Everything the runner does with a batch (the padding) stays SGLang's.
sys.meta_path.insert(0, _ModuleHooks())
