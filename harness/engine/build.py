"""Build an engine for a model name: weights, tokenizer, device, config."""
from __future__ import annotations

import functools

import torch
from dataclasses import replace

from harness.device import make_device
from harness.engine.config import MODELS, TINY, EngineConfig
from harness.engine.loop import Engine
from harness.engine.model import Model, init_tiny_weights
from harness.engine.tokenizer import ByteTokenizer


class ModelUnavailable(RuntimeError):
    pass


@functools.lru_cache(maxsize=4)
def load_model(name: str, max_context: int | None = None):
    """(ModelConfig, weights, tokenizer) for a model name; cached per process."""
    if name == "tiny":
        cfg = TINY if max_context is None else replace(TINY, max_context=max_context)
        return cfg, init_tiny_weights(TINY, 0), ByteTokenizer()
    if name == "smollm2":
        try:
            from harness.engine.smollm2 import load_smollm2
        except ImportError as e:  # transformers / gguf missing
            raise ModelUnavailable(f"smollm2 needs transformers and gguf ({e}); run `make venv`") from e
        try:
            return load_smollm2(max_context=max_context or 256)  # attention cost grows with it
        except RuntimeError as e:
            raise ModelUnavailable(str(e)) from e
    if name == "arith":
        cfg, weights = _load_arith()
        if max_context is not None:
            cfg = replace(cfg, max_context=max_context)
        return cfg, weights, ByteTokenizer()
    raise ModelUnavailable(f"unknown model {name!r}: expected one of {', '.join(MODELS)}")


def arith_loader():
    """fixtures/arith/loader.py as a module: the fixture lives in the repository, not in the package."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "fixtures" / "arith" / "loader.py"
    if not path.exists():
        raise ModelUnavailable(f"the arith fixture is missing ({path}); run from a checkout of the repository")
    spec = importlib.util.spec_from_file_location("overlap_harness_arith_loader", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _load_arith():
    mod = arith_loader()
    try:
        return mod.load_arith()
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelUnavailable(f"the arith fixture cannot be loaded: {e}") from e


def build_engine(cfg: EngineConfig) -> tuple[Engine, object]:
    mcfg, weights, tok = load_model(cfg.model, cfg.max_context)
    # One thread unless asked: on a shared 2-core machine idle OpenMP workers spinning against
    # other processes cost 15x (SmolLM2) to 100x (tiny); pass --threads on a machine of your own.
    threads = cfg.threads or 1
    torch.set_num_threads(threads)
    c = cfg.costs
    dev = make_device(cfg.device, cfg.policy, cfg.seed, launch_overhead=c.launch_ms / c.launches_per_step)
    model = Model(mcfg, weights, dev.torch_device)
    eng = Engine(cfg, mcfg, model, dev, tok.decode)
    from harness.engine.invariance import verify
    eng.invariance = verify(model)  # measured once per machine and build, then cached
    return eng, tok

