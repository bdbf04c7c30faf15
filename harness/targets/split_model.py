"""A model tensor and pipeline parallelism can split: SmolLM2-135M cut to fit (issue 45).

SmolLM2-135M has 9 attention heads over 3 KV heads, and neither engine splits 9 heads over two
ranks (vLLM checks `num_attention_heads % tensor_parallel_size`; SGLang the same). The arith
fixture has 4 and 2, but its own byte vocabulary and prompts, so no path workload reaches it.
So setup writes SmolLM2 cut to a shape two ranks divide, from its own weights and with its own
tokenizer (the path workloads, the chat template and the stop tokens stay what they are):

- the first LAYERS of its 30 layers (two pipeline stages of LAYERS / 2 each; a short model also
  keeps a pair of four-process servers cheap on two cores);
- KV heads 0..KV_HEADS-1 and the query heads that read them (GQA: 3 query heads a KV head), so
  6 query heads over 2 KV heads: each of two ranks holds 3 and 1; `o_proj` keeps the columns of
  the kept heads. The residual width (576) and the vocabulary (49152) stay, both even.

Its tokens are not SmolLM2's answers: what the attack needs is a deterministic model that both
arms run alike (overlap on = off), with real shapes and a real tokenizer. The directory is
stamped with the sha256 of the weights it was cut from and rewritten when they change.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

NAME = "smollm2-split"  # the model directory's name beside the others (--served-model split)
LAYERS = 4
KV_HEADS = 2
STAMP = "harness.json"


def _shape(cfg: dict) -> tuple[int, int, int]:
    """(query heads per KV head, head_dim, query heads kept) of the source config."""
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    if heads % kv or KV_HEADS > kv:
        raise ValueError(f"cannot keep {KV_HEADS} KV heads of {kv} ({heads} query heads)")
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return heads // kv, head_dim, heads // kv * KV_HEADS


def cut(tensors: dict, cfg: dict) -> tuple[dict, dict]:
    """(tensors, config) of the split model from SmolLM2's (numpy arrays by HF name)."""
    group, head_dim, q_heads = _shape(cfg)
    q_rows, kv_rows = q_heads * head_dim, KV_HEADS * head_dim
    out = {}
    for name, a in tensors.items():
        m = re.match(r"model\.layers\.(\d+)\.(.*)", name)
        if m and int(m.group(1)) >= LAYERS:
            continue
        rest = m.group(2) if m else ""
        if rest == "self_attn.q_proj.weight":  # [heads * head_dim, hidden]: the kept heads' rows
            a = a[:q_rows]
        elif rest in ("self_attn.k_proj.weight", "self_attn.v_proj.weight"):  # [kv * head_dim, hidden]
            a = a[:kv_rows]
        elif rest == "self_attn.o_proj.weight":  # [hidden, heads * head_dim]: the kept heads' columns
            a = a[:, :q_rows]
        out[name] = a.copy()
    cfg = {**cfg, "num_hidden_layers": LAYERS, "num_attention_heads": q_heads, "num_key_value_heads": KV_HEADS,
           "head_dim": head_dim}
    return out, cfg


def splits(cfg: dict, tp: int = 2, pp: int = 2) -> str:
    """"" when `tp` ranks divide the heads and `pp` stages the layers, else why not (one line)."""
    for what in ("num_attention_heads", "num_key_value_heads"):
        if cfg[what] % tp:
            return f"{what} {cfg[what]} is not divisible by tensor parallel size {tp}"
    if cfg["num_hidden_layers"] < pp:
        return f"{cfg['num_hidden_layers']} layers cannot fill {pp} pipeline stages"
    return ""


def _source_sha(src: Path) -> str:
    from harness.cache import file_sha256
    return file_sha256(Path(os.path.realpath(src / "model.safetensors")))


def current(d: Path, src: Path) -> bool:
    try:
        stamp = json.loads((d / STAMP).read_text())
        return (stamp.get("source_sha256") == _source_sha(src) and (d / "model.safetensors").is_file()
                and stamp.get("layers") == LAYERS and stamp.get("kv_heads") == KV_HEADS)
    except (OSError, ValueError):
        return False


def write(src: Path, dest: Path) -> Path:
    """SmolLM2's model directory `src` cut (cut()) into `dest`, written beside it then renamed."""
    from safetensors.numpy import load_file, save_file
    tensors, cfg = cut(load_file(str(src / "model.safetensors")), json.loads((src / "config.json").read_text()))
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in src.iterdir():  # the tokenizer and chat template, as they are
        if f.name not in ("config.json", "model.safetensors", STAMP) and f.is_file():
            shutil.copy2(f, tmp / f.name)
    (tmp / STAMP).write_text(json.dumps({"source_sha256": _source_sha(src), "layers": LAYERS,
                                         "kv_heads": KV_HEADS}))
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest


def ensure(src: Path, dest: Path, force: bool = False, log=None) -> Path:
    """The split model's directory, written where missing or cut from other weights."""
    if force or not current(dest, src):
        if log:
            log(f"      and the split model (SmolLM2 cut to {LAYERS} layers, {KV_HEADS} KV heads: TP/PP=2): {dest}")
        write(src, dest)
    return dest
