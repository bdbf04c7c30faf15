"""Frozen configuration for the model, the virtual costs and the engine."""
from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    max_context: int  # width of a req_to_token row (attention reduces over each request's own length)
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = True
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    pad_id: int = 0


# the model names the engine builds (harness.engine.build); here, without torch, so the CLI's parser
# and the flag checks need no torch import (a process that only reports bad input starts in 0.1 s, not 1.5)
MODELS = ("tiny", "smollm2", "arith")
MAX_SPEC_K = 8  # the most draft tokens a window may hold (harness.engine.spec), here for the same reason

TINY = ModelConfig(name="tiny", vocab_size=259, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16,
                   intermediate=128, max_context=256, tie_embeddings=False, bos_id=256, eos_ids=(257,), pad_id=258)
# An untied output head: with tied embeddings a random-init model mostly echoes its input token,
# so its output would not depend on the context and corrupted KV entries would go unseen.


@dataclass(frozen=True)
class Costs:
    """Virtual milliseconds charged by the simulated device (the article's Qwen3-8B figures by default)."""

    decode_ms: float = 3.4  # one decode pass over the batch
    prefill_ms_per_token: float = 0.02
    prepare_ms: float = 0.19  # CPU: pick the batch, reserve slots, build inputs
    launch_ms: float = 0.37  # CPU: issue the step's GPU work (spread over its launches)
    process_ms: float = 0.08  # CPU: append tokens, check stops, free finished requests
    sched_op_ms: float = 0.005  # a small op on the schedule stream
    copy_ms: float = 0.01  # device-to-host copy of a step's tokens
    launches_per_step: int = 6  # ops a step issues; launch_ms is spread over them
    verify_ms: float = 3.4  # speculative: the verify pass over the window
    draft_ms: float = 0.2  # one pass of the drafter
    extend_ms: float = 0.4  # draft extend (mtp)
    ngram_lookup_ms: float = 0.03  # NGRAM: the CPU's index lookup, per request


@dataclass(frozen=True)
class EngineConfig:
    model: str = "tiny"
    overlap: bool = True
    device: str = "sim"
    policy: str = "serial"
    seed: int = 0
    max_running: int = 16  # rows of req_to_token and relay entries (plus row/entry 0 for padding)
    pool_slots: int = 4096  # KV slots, including the padding page
    page_size: int = 1
    prefix_cache: bool = True
    max_prefill_tokens: int = 1024  # tokens one prefill step may process
    max_context: int | None = None  # overrides the model's row width
    faults: frozenset[str] = frozenset()  # names from harness.faults
    spec: str | None = None  # speculative decoding: oracle | mtp | ngram
    spec_k: int = 3  # draft tokens per window
    spec_wrong: float = 0.3  # oracle drafter: chance that a draft token is replaced by a wrong one
    threads: int | None = None  # torch CPU threads; None: 1 for small models, else torch's default
    costs: Costs = field(default_factory=Costs)

    def with_(self, **kw) -> "EngineConfig":
        return replace(self, **kw)
