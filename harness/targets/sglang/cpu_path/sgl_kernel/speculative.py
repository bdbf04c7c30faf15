"""`sgl_kernel.speculative`: the submodule SGLang's NGRAM path imports its tree-mask op from
(sglang/kernels/ops/speculative/reconstruct_tree.py, on every device but CUDA, HIP and XPU)."""
from sgl_kernel.spec_ops import reconstruct_indices_from_tree_mask

__all__ = ["reconstruct_indices_from_tree_mask"]
