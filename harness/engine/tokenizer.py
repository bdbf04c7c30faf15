"""Tokenizers: bytes for the tiny model, the real SmolLM2 tokenizer for smollm2."""
from __future__ import annotations


class ByteTokenizer:
    """UTF-8 bytes are tokens 0..255; 256 BOS, 257 EOS, 258 PAD."""

    bos_id, eos_id, pad_id = 256, 257, 258
    add_bos = True  # prompts start with BOS (SmolLM2's tokenizer adds none)
    vocab_size = 259

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict]) -> str:
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"
