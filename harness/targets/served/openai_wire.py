"""What an OpenAI-compatible server's answers look like on the wire, for the served targets
(harness.targets.served.pair, and the conversations of harness.targets.served.chat_turns): token ids asked
for as "token_id:N" (`return_tokens_as_token_ids`, vLLM's), the top-k records of the completions
and of the chat API, and an error's message."""
from __future__ import annotations

from harness.targets.base import TargetError

TOP_LOGPROBS = 5
# vLLM and SGLang (uvicorn) close a connection idle for 5 s, httpx's own pool keeps one 5 s: a
# request sent on a pooled connection as the server closes it is reset (ECONNRESET, seen in CI on a
# live vLLM server). Our clients drop idle connections well before the server does.
KEEPALIVE_S = 1.0


def client(timeout, max_connections: int | None = None):
    """An httpx client for an engine's server, whose idle connections expire before the server's."""
    import httpx
    return httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=max_connections,
                                                             keepalive_expiry=KEEPALIVE_S))


def error_message(resp) -> str:
    try:
        return str(resp.json()["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return resp.text[:300]


def stream_error(event: dict) -> str | None:
    """A streamed event that is an error (the server failed the request after its 200 and its
    first chunks; vLLM sends `{"error": {...}}`, older releases `{"object": "error", ...}`) as a
    finish reason: "server error CODE: MESSAGE"; None for a chunk."""
    err = event.get("error") if isinstance(event.get("error"), dict) else (
        event if event.get("object") == "error" else None)
    if err is None:
        return None
    return f"server error {err.get('code', '?')}: {str(err.get('message', ''))[:300]}"


def token_id(tok: str) -> int:
    if not tok.startswith("token_id:"):
        raise TargetError(f"expected a token id, got {tok!r} (the server ignored return_tokens_as_token_ids)")
    return int(tok[len("token_id:"):])


def ids_and_logprobs(lp: dict) -> tuple[list[int], list]:
    """Token ids and (own logprob, [(token, logprob)] top-k) per position, from an OpenAI
    completions `logprobs` object whose tokens are "token_id:N" (return_tokens_as_token_ids)."""
    ids, out = [], []
    tops = lp.get("top_logprobs") or []
    for i, (tok, own) in enumerate(zip(lp.get("tokens") or [], lp.get("token_logprobs") or [])):
        ids.append(token_id(tok))
        top = tops[i] if i < len(tops) and tops[i] else {}
        out.append((float(own) if own is not None else float("nan"),
                    sorted(((token_id(t), float(v)) for t, v in top.items()), key=lambda x: -x[1])))
    return ids, out


def chat_ids_and_logprobs(lp: dict | None) -> tuple[list[int], list]:
    """The same from a chat choice's `logprobs.content` (one entry per token, its top-k a list)."""
    ids, out = [], []
    for e in (lp or {}).get("content") or []:
        ids.append(token_id(e["token"]))
        top = sorted(((token_id(t["token"]), float(t["logprob"])) for t in e.get("top_logprobs") or []),
                     key=lambda x: -x[1])
        own = e.get("logprob")
        out.append((float(own) if own is not None else float("nan"), top))
    return ids, out
