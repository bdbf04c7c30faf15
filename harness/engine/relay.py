"""The relay (SGLang's FutureMap): device buffers with one entry per request,
plus entry 0 that belongs to no request so padded rows read and write something
harmless. A step writes what the next step reads into its requests' entries;
the CPU hands a queued step only entry numbers, never a token."""
from __future__ import annotations

import torch

from harness.device.stream import Device
from harness.engine.memory import Rows


class Relay:
    def __init__(self, dev: Device, max_running: int):
        self.entries = Rows(max_running)
        self.tokens = dev.alloc("relay.tokens", (max_running + 1,), torch.int64)  # [entries + 1]

    def publish_tokens(self, entries: torch.Tensor, tokens: torch.Tensor) -> None:
        """Device side, end of a step: entries [B], tokens [B]."""
        self.tokens.index_copy_(0, entries, tokens)

    def read_tokens(self, entries: torch.Tensor, out: torch.Tensor) -> None:
        """Device side, start of a step: the input token of each row."""
        torch.index_select(self.tokens, 0, entries, out=out)
