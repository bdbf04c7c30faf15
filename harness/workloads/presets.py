"""Request streams: presets the tests and the CLI share (hypothesis strategies join later)."""
from __future__ import annotations

import random
import string

from harness.engine.request import Request

SYSTEM = "You are a careful assistant. Answer in one short sentence. "
WORDS = "slot table relay fence window step stream token prefix cache batch entry row page copy event".split()


def _ids(tok, text: str) -> list[int]:
    ids = tok.encode(text)
    return ([tok.bos_id] if getattr(tok, "add_bos", False) else []) + ids


def mixed(tok, n: int = 10, seed: int = 0) -> list[Request]:
    """Different prompt lengths, a shared system prefix, stop strings, an abort,
    seeded sampling, and staggered arrivals."""
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))
        text = (SYSTEM + words) if i % 2 == 0 else words
        r = Request(rid=f"m{i}", prompt_ids=_ids(tok, text), max_new_tokens=rng.randint(2, 24),
                    arrival=rng.randint(0, 6))
        if i % 5 == 1:
            r.stop = tuple(string.ascii_letters + string.digits)  # likely soon, even for a random model
            r.max_new_tokens = 24
        if i % 5 == 3:
            r.abort_after = 3
            r.max_new_tokens = 24
        if i % 4 == 2:
            r.temperature, r.top_p, r.seed = 0.8, 0.9, rng.randrange(1 << 30)
        reqs.append(r)
    return reqs


def row_reuse(tok, n: int = 16, seed: int = 0) -> list[Request]:
    """Short prompts finishing early while long shared-prefix prompts wait: a freed row is
    handed at once to a request whose cached prefix covers the positions the extra step writes
    (the article's Figure 9, where a missing fence corrupts the cache)."""
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        text = (SYSTEM + f"Q{i}?") if i % 2 else f"x{i}"
        mt = 2 + (i * 5) % 7 if seed == 0 else rng.randint(1, 9)
        reqs.append(Request(rid=f"w{i}", prompt_ids=_ids(tok, text), max_new_tokens=mt))
    return reqs


def pressure(tok, n: int = 6, seed: int = 0) -> list[Request]:
    """Long outputs that cannot all fit a small pool (run with about 120 slots and 4 rows):
    decode growth forces retraction while a step with the victims is in flight."""
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5)))
        r = Request(rid=f"g{i}", prompt_ids=_ids(tok, words), max_new_tokens=rng.randint(30, 45))
        if i % 3 == 2:
            r.temperature, r.top_p, r.seed = 0.9, 0.95, rng.randrange(1 << 30)
        reqs.append(r)
    return reqs


def clone(reqs: list[Request]) -> list[Request]:
    """Fresh copies (a Request carries its run's state)."""
    return [Request(rid=r.rid, prompt_ids=list(r.prompt_ids), max_new_tokens=r.max_new_tokens, stop=r.stop,
                    temperature=r.temperature, top_p=r.top_p, seed=r.seed, ignore_eos=r.ignore_eos,
                    repetition_penalty=r.repetition_penalty,
                    arrival=r.arrival, abort_after=r.abort_after) for r in reqs]
