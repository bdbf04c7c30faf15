"""A request and its CPU-side state."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class State(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    rid: str
    prompt_ids: list[int]
    max_new_tokens: int = 32
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0  # HF semantics, over the prompt and every token so far
    ignore_eos: bool = False
    arrival: int = 0  # loop iteration at which the client sends it
    abort_after: int | None = None  # the client aborts once it has seen this many tokens

    # CPU state
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list = field(default_factory=list)  # per token: (its logprob, [(token, logprob)] top-K)
    state: State = State.WAITING
    finish_reason: str | None = None
    text: str = ""
    row: int | None = None  # row of req_to_token
    entry: int | None = None  # relay entry
    pages: list[int] = field(default_factory=list)  # the row's pages, in position order
    cached_nodes: list = field(default_factory=list)  # prefix-cache nodes this request locks
    fill: int = 0  # positions whose KV the launched steps have written or will write
    gen: int = 0  # admissions so far: a step's result for an older admission is discarded
    aborted: bool = False
    retractions: int = 0
    hit_pages: int = 0  # cached pages its prompt found at its first admission (another request's: a prefix hit)
    seq_at_admit: list[int] = field(default_factory=list)  # what the last prefill computed

    @property
    def n_cached_pages(self) -> int:
        return len(self.cached_nodes)

    def seq(self) -> list[int]:
        """What a (re)prefill computes: the prompt plus every token already processed."""
        return self.prompt_ids + self.output_ids

    @property
    def finished(self) -> bool:
        return self.state is State.FINISHED
