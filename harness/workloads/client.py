"""What a request of a workload asks of the client that sends it, in the words both sides use: the
target that sends it (harness.targets.served.chat_turns) and the oracles that judge what came back
(harness.oracles.request_ids, harness.oracles.turns). It lives below both, so neither imports the
other for a key name.

- HEADER_KEY / PRIORITY_KEY: body keys of ours that the client sends as headers (X-Request-Id,
  X-Vllm-Priority), never in the body;
- a conversation's turn k comes back as its own output, `<rid>@<k>` (turn_rid / split_turn).
"""
from __future__ import annotations

HEADER_KEY = "oh_x_request_id"  # a body key of ours: sent as the X-Request-Id header, never in the body
# the priority as the X-Vllm-Priority header (vLLM 0.32 takes it over the body's `priority`: both
# APIs, `_get_priority`); the body then says 0, so a server that ignored the header would schedule
# by 0 (under the priority policy: harness.targets.vllm.configs)
PRIORITY_KEY = "oh_x_vllm_priority"
HEADERS = {HEADER_KEY: "X-Request-Id", PRIORITY_KEY: "X-Vllm-Priority"}
TURN_SEP = "@"  # output rid of turn k: f"{rid}@{k}" ('#' is taken by the n samples of one request)


def turn_rid(rid: str, k: int) -> str:
    return f"{rid}{TURN_SEP}{k}"


def split_turn(rid: str) -> tuple[str, int | None]:
    """(the request's rid, its turn or None) of an output rid."""
    head, sep, k = rid.partition(TURN_SEP)
    return (head, int(k)) if sep and k.isdigit() else (rid, None)
