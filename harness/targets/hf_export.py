"""Our small models as Hugging Face Llama directories, so a real engine can serve them.

The `arith` fixture is a Llama (RMSNorm, rotate-half RoPE, SwiGLU, GQA, untied head) over bytes:
token b is byte b, 256/257/258 are BOS/EOS/PAD. Its weights already carry HF names. The
tokenizer is built with `tokenizers`: byte-level pre-tokenization maps each byte to one
symbol and a merge-free BPE vocabulary maps that symbol back to the byte's value, so ids equal
ours; a post-processor puts BOS in front, as our engine does. On GSM8K-format questions it
answers about 94% right, so a GSM8K gate against a real engine can see accuracy move.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

ARITH_POSITIONS = 512  # RoPE has no table to outgrow; room for the prompt and lm-eval's max_gen_toks


def byte_tokenizer(bos: int, eos: int, pad: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast
    alphabet = ByteLevel.alphabet()  # the 256 symbols byte-level pre-tokenization maps bytes to
    to_symbol = {}
    for b in range(256):  # the same table ByteLevel uses: printable bytes stand for themselves
        to_symbol[b] = None
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    n = 0
    for b in range(256):
        if b in printable:
            to_symbol[b] = chr(b)
        else:
            to_symbol[b] = chr(256 + n)
            n += 1
    assert set(to_symbol.values()) == set(alphabet), "the byte-level alphabet is not the one expected"
    vocab = {to_symbol[b]: b for b in range(256)}
    vocab.update({"<bos>": bos, "<eos>": eos, "<pad>": pad})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<bos>", "<eos>", "<pad>"])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B",
                                                       special_tokens=[("<bos>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


STAMP = "harness.json"


def fixture_sha256() -> str:
    from harness.engine.build import arith_loader
    from harness.cache import file_sha256
    loader = arith_loader()
    return file_sha256(Path(loader.HERE) / loader.WEIGHTS)


def arith_dir_current(d: Path) -> bool:
    try:
        return json.loads((d / STAMP).read_text()).get("fixture_sha256") == fixture_sha256()
    except (OSError, ValueError):
        return False


def write_arith_dir(dest: Path) -> Path:
    from harness.engine.build import arith_loader
    loader = arith_loader()
    loader.verify(loader.HERE)
    cfg, _ = loader.load_config(loader.HERE)
    HERE, WEIGHTS = loader.HERE, loader.WEIGHTS
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": cfg.hidden,
              "intermediate_size": cfg.intermediate, "num_hidden_layers": cfg.layers,
              "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
              "vocab_size": cfg.vocab_size, "max_position_embeddings": ARITH_POSITIONS,
              "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_eps, "tie_word_embeddings": cfg.tie_embeddings,
              "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "bos_token_id": cfg.bos_id,
              "eos_token_id": list(cfg.eos_ids)[0], "pad_token_id": cfg.pad_id, "torch_dtype": "float32"}
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    byte_tokenizer(cfg.bos_id, cfg.eos_ids[0], cfg.pad_id).save_pretrained(str(tmp))
    shutil.copy2(Path(HERE) / WEIGHTS, tmp / "model.safetensors")  # 2 MB: a copy outlives the checkout
    (tmp / STAMP).write_text(json.dumps({"fixture_sha256": fixture_sha256()}))
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest
