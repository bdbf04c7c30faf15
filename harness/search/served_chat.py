"""The request surface a completions mix never drew (issue 36, item 2): multi-turn chat and
client-set request ids, drawn into a served submission (`submissions`: served_case's, with these).

Each mix of a submission is, by a hash of what was drawn for it (a drawn coin repeats: see
served_case), one of:
- a **conversation** (feature `chat`, one in eight mixes): one request whose body carries `chat`,
  the user's messages of 2-3 turns (the first short, or the shared prefix's text, so that
  conversations share cached blocks; the next ones a few words), sent on /v1/chat/completions
  turn after turn with the arm's own answers appended (harness.targets.served.chat_turns); the sampling
  and options of a drawn request (greedy or seeded, penalties, bad words, stop strings and ids,
  logit bias, processors), never a disconnect, n > 1, a grammar, a stream or prompt logprobs;
- **client ids** (features `request_id`, `x-request-id`, one in eight): each request of the mix
  sends its own id, in the body or in the header;
- a **duplicate id** (feature `duplicate_id`, one in eight): two requests sent together with one
  id (body or header), both running to their length (EOS ignored, nothing that stops them), with
  prompts and max_tokens of different lengths, and in half of them the first disconnects after a
  few tokens: the other must still get its whole answer (harness.oracles.request_ids).

Under the priority policy (configuration `priority`) one request in four sends its priority as the
`X-Vllm-Priority` header, the body saying 0 (feature `x-vllm-priority`).
"""
from __future__ import annotations

import zlib

from hypothesis import strategies as st

from harness.oracles.request_ids import DUPLICATE_MARK
from harness.search import served_effects
from harness.targets.served.chat_turns import HEADER_KEY, PRIORITY_KEY, chat_prompt_ids

CHAT, IDS, DUPLICATE = 0, 1, 2  # a mix's hash modulo COIN: what it becomes
COIN = 8
NOT_IN_CHAT = ("prompt_logprobs", "stream", "structured_outputs")  # one-shot fields: kept to completions
STOPPERS = ("stop_token_ids", "min_tokens", "structured_outputs")  # what could end a request before its length
# a pair's first may disconnect (a stream), and vLLM refuses prompt_logprobs on a stream (measured:
# 4 runs of 14 refused with 400); the second gets none either, so the two stay alike
NOT_IN_PAIR = STOPPERS + ("prompt_logprobs",)


@st.composite
def conversation(draw, tok, rid: str, priority: bool = False):
    """One conversation of 2-3 turns; its prompt ids are the first turn's (the template over the
    first message), so the steps oracle and the summary see what the engine sees first."""
    from harness.search.served_case import _words, requests
    from harness.targets.vllm import workload as vllm_workload
    r = draw(requests(tok, rid, True, priority=priority))
    r.n, r.abort_after = 1, None
    for k in NOT_IN_CHAT:
        r.extra.pop(k, None)
    shared = draw(st.booleans())
    first = (vllm_workload.PREFIX + _words(draw, 1, 6)) if shared else _words(draw, 2, 12)
    turns = [first] + [_words(draw, 2, 8) for _ in range(draw(st.integers(1, 2)))]
    r.extra["chat"] = turns
    r.prompt_ids = chat_prompt_ids(tok, [{"role": "user", "content": first}]) or list(tok.encode(first))
    r.shared_prefix = shared
    return r


def with_client_ids(draw, mix: list, i: int) -> list:
    """Each request of a mix with its own client id, in the body or the header."""
    for r in mix:
        where = draw(st.sampled_from(("request_id", HEADER_KEY)))
        r.extra[where] = f"oh-{r.rid}"
    return mix


@st.composite
def duplicate_pair(draw, tok, i: int, priority: bool = False):
    """Two requests of mix `i` sent together with one client id; the first may disconnect."""
    from harness.search.served_case import requests
    a, b = (draw(requests(tok, f"c{i}r{j}", True, priority=priority)) for j in range(2))
    cid = f"oh{DUPLICATE_MARK}c{i}"
    where = draw(st.sampled_from(("request_id", HEADER_KEY)))
    ma = draw(st.integers(8, 18))
    for r, m in ((a, ma), (b, ma + draw(st.integers(1, 6)))):
        r.n, r.ignore_eos, r.stop, r.max_new_tokens, r.abort_after = 1, True, (), m, None
        for k in NOT_IN_PAIR:
            r.extra.pop(k, None)
        r.extra[where] = cid
    b.arrival = a.arrival
    if len(b.prompt_ids) == len(a.prompt_ids):  # a crossed answer shows by its prompt's length
        b.prompt_ids = b.prompt_ids[:-1]
    # a hash of the pair, not a drawn coin (which hypothesis's small searches kept at False: a
    # 3-minute search drew 7 pairs, none with a disconnect)
    if zlib.crc32(repr((a, b)).encode()) % 2:
        a.abort_after = draw(st.integers(1, ma - 1))
    return [a, b]


def redraw(draw, tok, mixes: list, priority: bool = False) -> list:
    """The mixes of one submission, one in eight made a conversation, one in eight given client ids,
    one in eight replaced by a duplicate-id pair (by a hash of each mix as drawn)."""
    out = []
    for i, mix in enumerate(mixes):
        coin = zlib.crc32(repr(mix).encode()) % COIN
        if coin == CHAT:
            mix = [draw(conversation(tok, f"c{i}r0", priority))]
        elif coin == IDS:
            mix = with_client_ids(draw, mix, i)
        elif coin == DUPLICATE:
            mix = draw(duplicate_pair(tok, i, priority))
        for r in mix:  # item 3's rule on a field of the async path (harness.search.served_effects)
            served_effects.maybe_allowed_ids(draw, tok, r)
            if priority and zlib.crc32(repr(r).encode()) % 4 == 1:  # the priority as a header (X-Vllm-Priority)
                r.extra[PRIORITY_KEY] = int(getattr(r, "priority", 0))
        out.append(mix)
    return out


def submissions(tok, cases: int = 4, vllm: bool = True, agent: bool = True, priority: bool = False):
    """served_case.submissions with this module's draws (what the served search draws)."""
    from harness.search.served_case import submissions as plain
    return plain(tok, cases, vllm=vllm, agent=agent, priority=priority, surface=redraw)
