"""Which model runner a vLLM process runs: V1 (`gpu_model_runner.py`) or V2 (`vllm/v1/worker/gpu/`).

vLLM decides in its config (`VllmConfig.use_v2_model_runner`), after plugins load, so the agent
follows the same inputs, in this order:
1. the plan's "runner" (the target knows what it started: the verdict names it);
2. VLLM_USE_V2_MODEL_RUNNER ("1": V2, "0": V1), which vLLM's config obeys;
3. a release without V1's runner (0.34.0 on): V2;
4. vLLM's default from 0.32: V2 wherever Triton works, i.e. on a CUDA device with triton
   importable; V1 on vLLM's CPU build, whose Triton check fails ("Model Runner V2 requires
   Triton; using the V1 model runner instead").
"""
from __future__ import annotations

import os

V1_GONE = "0.34.0"  # the first release without vllm/v1/worker/gpu_model_runner.py
V2_DEFAULT = "0.32.0"  # the first release checked whose config defaults to V2 where Triton works


def decide(plan_data: dict | None, version: str | None, env=None) -> str:
    from harness.targets.vllm.releases import release_key
    env = os.environ if env is None else env
    want = (plan_data or {}).get("runner")
    if want in ("v1", "v2"):
        return want
    flag = env.get("VLLM_USE_V2_MODEL_RUNNER")
    if flag is not None and flag.strip() != "":
        return "v2" if flag.strip().lower() in ("1", "true", "yes") else "v1"
    if version is not None and release_key(version) >= release_key(V1_GONE):
        return "v2"
    if version is not None and release_key(version) >= release_key(V2_DEFAULT) and _cuda_with_triton():
        return "v2"
    return "v1"


def _cuda_with_triton() -> bool:
    try:
        import importlib.util

        import torch
        return bool(torch.cuda.is_available()) and importlib.util.find_spec("triton") is not None
    except Exception:
        return False


V1_WORKER_FILES = ("v1/worker/gpu_model_runner.py", "v1/worker/gpu_input_batch.py", "v1/sample/")


def needs(fault: str) -> str | None:
    """The runner a fault needs to mean anything: "v2" for V2's source patches, "v1" for a patch
    of V1's worker files or an agent fault at a V1-only point; None where both runners have the
    code (the engine core, or a point the V2 agent has too: the copy and its wait)."""
    from harness.agents.vllm.v2.patches import RUNNER
    from harness.agents.vllm.v2.points import DELAY_AT
    from harness.agents.vllm.patches import PATCHES
    from harness.agents.vllm.points import CATALOGUE, POINTS_BY_NAME
    if fault in RUNNER:
        return RUNNER[fault]
    if fault in PATCHES:
        return "v1" if PATCHES[fault].file.startswith(V1_WORKER_FILES) else None
    if fault in CATALOGUE:
        point = CATALOGUE[fault].point
        return None if point in DELAY_AT else (POINTS_BY_NAME[point].runner or None)
    return None
