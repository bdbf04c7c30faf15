"""Reproducers of served cases, in the format of fixtures/vllm_upstream/*.json: the requests as
OpenAI completion bodies (without "model"), so `python -m fixtures.vllm_upstream.reproduce FILE`
sends them too (one after the other, without the timing); and under "harness" what stress and
`replay --target vllm` need to run the case as it was found: each request's rid, arrival and
disconnect, the async-on server's delays, the controls, the source patches, the release, and the
verdict to compare."""
from __future__ import annotations

import json
import os

from harness.engine.request import Request
from harness.search.served_case import ServedCase

FORMAT = "overlap-harness-served-repro"
CLIENT_KEYS = ("model", "logprobs", "return_tokens_as_token_ids", "skip_special_tokens")


def body(target, r: Request) -> dict:
    """The request as the target sends it (its derived seed included), without the client's keys."""
    b = target.payload(r, True)
    return {k: v for k, v in b.items() if k not in CLIENT_KEYS}


def request_of(b: dict, rid: str, arrival: int = 0, abort_after=None) -> Request:
    b = dict(b)
    r = Request(rid=rid, prompt_ids=[int(t) for t in b.pop("prompt")], max_new_tokens=int(b.pop("max_tokens", 16)),
                temperature=float(b.pop("temperature", 0.0)), top_p=float(b.pop("top_p", 1.0)), seed=b.pop("seed", None),
                stop=tuple(b.pop("stop", ())), repetition_penalty=float(b.pop("repetition_penalty", 1.0)),
                ignore_eos=bool(b.pop("ignore_eos", False)), arrival=int(arrival), abort_after=abort_after)
    r.n = int(b.pop("n", 1))
    r.priority = int(b.pop("priority", 0))  # the priority policy's (harness.targets.vllm.configs)
    for k in CLIENT_KEYS:
        b.pop(k, None)
    r.extra = b
    return r


def reproducer(target, case: ServedCase, finding, *, seed: int, patches=(), version=None, found=None) -> dict:
    steps = finding.kind == "steps"
    return {
        "id": f"stress-{finding.kind}",
        "what": f"found by `overlap-harness stress --target {target.name}` (seed {seed}): {finding.summary}",
        "upstream": "",
        "steps": steps,
        "counters": [],
        "requests": [body(target, r) for r in case.requests],
        "harness": {"format": FORMAT, "version": 1, "target": target.name, "vllm_version": version,
                    # the server configuration the servers ran (harness.targets.vllm.configs); a
                    # reproducer without one ran the default
                    "config": getattr(getattr(target, "config", None), "name", None),
                    "patches": sorted(patches), "seed": seed,
                    "rids": [r.rid for r in case.requests], "arrival": [r.arrival for r in case.requests],
                    "abort_after": [r.abort_after for r in case.requests],
                    "delays": case.delays, "controls": [list(c) for c in case.controls],
                    "verdict": finding.to_dict(), "found": found or {}},
    }


def write(path: str, d: dict) -> str:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(d, f, indent=1)
    os.replace(tmp, path)
    return path


class BadServedRepro(ValueError):
    """Not a served reproducer, or a damaged one (one line)."""


def is_served(d: dict) -> bool:
    return isinstance(d, dict) and isinstance(d.get("harness"), dict) and d["harness"].get("format") == FORMAT


def load(path: str) -> tuple[dict, ServedCase]:
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError) as e:
        raise BadServedRepro(f"cannot read {path}: {e}") from None
    if not is_served(d):
        raise BadServedRepro(f"{path} is not a served-target reproducer (no \"harness\": {{\"format\": \"{FORMAT}\"}})")
    h = d["harness"]
    reqs = d.get("requests")
    n = len(reqs) if isinstance(reqs, list) else -1
    if n < 1 or any(len(h.get(k) or []) != n for k in ("rids", "arrival", "abort_after")):
        raise BadServedRepro(f"{path}: \"requests\" and harness rids/arrival/abort_after must be lists of one length")
    try:
        rs = [request_of(b, rid, a, k) for b, rid, a, k in zip(reqs, h["rids"], h["arrival"], h["abort_after"])]
    except (KeyError, TypeError, ValueError) as e:
        raise BadServedRepro(f"{path}: a request body is not one stress wrote ({type(e).__name__}: {e})") from None
    controls = [(float(at), str(w)) for at, w in h.get("controls") or []]
    from harness.search.served_case import CONTROLS
    bad = [w for _, w in controls if w not in CONTROLS]
    if bad:
        raise BadServedRepro(f"{path}: unknown control {bad[0]!r} (expected one of {', '.join(CONTROLS)})")
    return d, ServedCase(rs, dict(h.get("delays") or {}), controls, 1)
