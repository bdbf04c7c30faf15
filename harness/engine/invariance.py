"""Batch invariance, measured where the engine runs.

The model (harness/engine/model.py) is built so that no matmul or reduction changes shape
with the batch. What that construction leaves to the machine's kernels is measured here, at
start-up, on the model's own methods and weight shapes: every linear layer (F.linear and the
oneDNN-packed path alike) at every row count from 1 to MAX_ROWS against each row computed
alone, RMSNorm likewise, and attention for decode batches of 1 to MAX_ROWS requests and for a
prefill against the same positions decoded one at a time.

The result is cached per machine and build (CPU model and capability or GPU name, torch
version, thread count, the ISA caps of MKL / oneDNN / ATen in force, the model's shapes, and
the source of the model and of this probe) in `<cache root>/batch_invariance.json`, so later
start-ups cost a file read. A model whose probed methods are not this repository's (a
subclass, a patched method) is probed each time and never cached.

Where it is not verified, the ref target reports `batch_invariant = False`, and the suites
judge it as a real engine: tie or race, never rounding called a race (harness/oracles/reference.py).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

MAX_ROWS = 64  # row counts probed: 1..MAX_ROWS (the engine's decode batches and prefill tiles)
ISA_CAPS = ("MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
PROBED = ("linear", "_rms", "_attend", "_attention", "_chunk_plan", "pass_context", "_kv_len")
CACHE_FILE = "batch_invariance.json"
FORMAT = 1


@dataclass(frozen=True)
class Verdict:
    ok: bool
    where: str  # "<cpu capability>, <torch version>" (or the GPU's name)
    counterexample: str | None = None
    seconds: float = 0.0  # probe time (0 when read from the cache)
    cached: bool = False

    @property
    def line(self) -> str:
        if self.ok:
            return f"batch invariance: verified ({self.where})"
        return f"batch invariance: NOT verified: {self.counterexample} ({self.where})"


_MEMO: dict[str, Verdict] = {}
_SOURCES: str | None = None


def _sources() -> str:
    """Hash of the model's and this probe's source: an edit re-probes."""
    global _SOURCES
    if _SOURCES is None:
        from harness.engine import model
        h = hashlib.sha256()
        for f in (model.__file__, __file__):
            h.update(Path(f).read_bytes())
        _SOURCES = h.hexdigest()[:16]
    return _SOURCES


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def where(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"{torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}"


def stock(model) -> bool:
    """True when every probed method is this repository's Model's own."""
    from harness.engine import model as mod
    cls = type(model)
    return all(getattr(cls, m, None) is getattr(mod.Model, m) and m not in vars(model) for m in PROBED)


def cache_key(model) -> str:
    caps = {k: os.environ[k] for k in ISA_CAPS if k in os.environ}
    dev = model.device
    machine = torch.cuda.get_device_name(dev) if dev.type == "cuda" else _cpu_name()
    shapes = sorted({tuple(w.shape) for w in model.w.values()})
    parts = [FORMAT, where(dev), machine, torch.get_num_threads(), caps, model.cfg.name, shapes,
             model.cfg.max_context, _sources()]
    return json.dumps(parts, sort_keys=True, default=str)


def _cache_path() -> Path:
    from harness.cache import cache_root
    return cache_root() / CACHE_FILE


def _read_cache() -> dict:
    try:
        return json.loads(_cache_path().read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(key: str, v: Verdict) -> None:
    path = _cache_path()
    data = _read_cache()
    data[key] = {"ok": v.ok, "where": v.where, "counterexample": v.counterexample, "seconds": round(v.seconds, 3)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)  # concurrent start-ups: the last complete file wins
    except OSError:
        pass  # a read-only cache costs a probe per process, nothing else


def verify(model, use_cache: bool = True) -> Verdict:
    """The model's batch invariance on this machine: from the cache, or measured now."""
    key = cache_key(model)
    cacheable = use_cache and stock(model)
    memo_key = key if cacheable else f"{key}|{id(model)}"
    if memo_key in _MEMO:
        return _MEMO[memo_key]
    if cacheable:
        rec = _read_cache().get(key)
        if rec is not None:
            v = Verdict(rec["ok"], rec["where"], rec.get("counterexample"), 0.0, cached=True)
            _MEMO[memo_key] = v
            return v
    t = time.perf_counter()
    with torch.no_grad():
        bad = probe(model)
    v = Verdict(bad is None, where(model.device), bad, time.perf_counter() - t)
    if cacheable:
        _write_cache(key, v)
    _MEMO[memo_key] = v
    return v


# -- the probe ------------------------------------------------------------------------------
def _first_mismatch(got: torch.Tensor, want: torch.Tensor) -> int | None:
    same = (got == want) | (torch.isnan(got) & torch.isnan(want))
    rows = (~same.reshape(got.shape[0], -1).all(-1)).nonzero()
    return int(rows[0]) if rows.numel() else None


def _rows_agree(fn, x: torch.Tensor, what: str, counts=None) -> str | None:
    """fn on x[:n] for n in counts (default 1..MAX_ROWS): every row equals that row computed
    alone (rows past the largest count computed alone: against the MAX_ROWS-row result)."""
    counts = list(range(1, MAX_ROWS + 1)) if counts is None else counts
    n_alone = MAX_ROWS if len(counts) == MAX_ROWS else max(n for n in counts if n <= 8)
    alone = torch.cat([fn(x[i:i + 1]) for i in range(n_alone)])
    if n_alone < MAX_ROWS:
        alone = torch.cat([alone, fn(x)[n_alone:]])
    for n in counts:
        i = _first_mismatch(fn(x[:n]), alone[:n])
        if i is not None:
            return f"{what}: row {i} of {n} differs from the row alone"
    return None


# The output head (SmolLM2: 49152 x 576) costs a tile call as much as a layer's seven: it is
# probed at every row count of one tile and at the tile boundaries past it.
BIG_WEIGHT = 1 << 22
BIG_COUNTS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64]


def _linear_classes(model) -> list[str]:
    """One weight name per (shape, path) among the weights the model multiplies by."""
    from harness.engine.model import pack_weight
    seen, names = set(), []
    for name, w in model.w.items():
        if w.dim() != 2 or name.endswith("embed_tokens.weight") and not model.cfg.tie_embeddings:
            continue
        cls = (tuple(w.shape), pack_weight(w) is None)
        if cls not in seen:
            seen.add(cls)
            names.append(name)
    return names


def probe(model) -> str | None:
    """The first counterexample to batch invariance in the model's kernels, or None."""
    g = torch.Generator().manual_seed(0)
    dev = model.device

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dev)

    from harness.engine.model import pack_weight
    H = model.cfg.hidden
    for name in _linear_classes(model):
        w = model.lm_head if name == "model.embed_tokens.weight" else model.w[name]
        path = "F.linear" if pack_weight(w) is None else "oneDNN packed"
        fn = (lambda t: model.logits(t)) if w is model.lm_head else (lambda t, n=name: model.linear(t, n))
        bad = _rows_agree(fn, rand(MAX_ROWS, w.shape[1]), f"linear {name} [{w.shape[1]} -> {w.shape[0]}, {path}]",
                          BIG_COUNTS if w.numel() > BIG_WEIGHT else None)
        if bad:
            return bad
    wn = model.w["model.norm.weight"]
    bad = _rows_agree(lambda t: model._rms(t, wn), rand(MAX_ROWS, H), "rms_norm")
    return bad or _attention_probe(model, rand)


def _attention_probe(model, rand) -> str | None:
    """Decode batches of 1..MAX_ROWS requests (lengths on both sides of chunk boundaries, up to
    the row width) against each request alone, and a prefill against decoding its positions."""
    from harness.engine.model import KV_CHUNK
    cfg, dev = model.cfg, model.device
    C, W = KV_CHUNK, cfg.max_context
    lens = sorted({n for n in (1, 2, C - 1, C, C + 1, 2 * C + 5, 3 * C, W // 2 + 3, W - 1) if 1 <= n < W})
    slots = W * MAX_ROWS + 1
    k_pool, v_pool = rand(slots, cfg.kv_heads, cfg.head_dim), rand(slots, cfg.kv_heads, cfg.head_dim)
    k_pool[0] = v_pool[0] = 0  # slot 0: the padding slot
    rows = (1 + torch.arange(MAX_ROWS * W, device=dev)).view(MAX_ROWS, W)  # request b's slots
    q = rand(MAX_ROWS, cfg.heads, cfg.head_dim)
    pos = torch.tensor([lens[b % len(lens)] - 1 for b in range(MAX_ROWS)], device=dev)

    def decode(b0, n):
        ctx = model.pass_context(pos[b0:b0 + n], [(i, 1) for i in range(n)], rows[b0:b0 + n],
                                 [int(p) + 1 for p in pos[b0:b0 + n]])
        return model._attention(q[b0:b0 + n], ctx, k_pool, v_pool)

    alone = torch.cat([decode(b, 1) for b in range(MAX_ROWS)])
    for n in range(2, MAX_ROWS + 1):
        i = _first_mismatch(decode(0, n), alone[:n])
        if i is not None:
            return f"attention: request {i} of a decode batch of {n} (length {lens[i % len(lens)]}) differs from alone"
    # a prefill of T tokens of request 0 (two groups: a prefix and the rest, as chunked prefill
    # splits it) equals decoding each of those positions
    T = min(W, MAX_ROWS)
    tpos = torch.arange(T, device=dev)
    qs = rand(T, cfg.heads, cfg.head_dim)
    half = T // 2
    ctx = model.pass_context(tpos, [(0, half), (half, T - half)], rows[[0, 0]], [half, T])
    pre = model._attention(qs, ctx, k_pool, v_pool)
    for t in range(T):
        c1 = model.pass_context(tpos[t:t + 1], [(0, 1)], rows[:1], [t + 1])
        if _first_mismatch(model._attention(qs[t:t + 1], c1, k_pool, v_pool), pre[t:t + 1]) is not None:
            return f"attention: position {t} of a {T}-token prefill differs from decoding it"
    return None
