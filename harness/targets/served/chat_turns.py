"""Two client behaviours of the request surface (issue 36, item 2) that the completions workload
never had: a multi-turn conversation on /v1/chat/completions, and client-set request ids.

- A conversation (a Request whose body carries `chat`: the user's messages, one per turn): turn k
  sends the messages so far, the arm's own answers included, and the assistant's answer of turn k
  is appended before turn k+1 (what a chat client does). Each turn comes back as its own output
  `<rid>@<k>` with its token ids and top-5 records (`logprobs` + `return_tokens_as_token_ids`,
  which vLLM's chat API honours), its finish and stop reason, usage and text, and the prompt
  ids the client expects the server to see (the chat template over the messages, tokenized):
  the token oracles compare the turns like any request, and harness.oracles.turns keeps the turns
  after the arms' first difference out (their prompts differ: not comparable).
- Request ids: `request_id` is a body field of both APIs and goes as it is; the key HEADER_KEY of a
  Request's body is sent as the `X-Request-Id` header instead (vLLM 0.32 takes the header over the
  body's field: `OpenAIServing._base_request_id`), PRIORITY_KEY as `X-Vllm-Priority`. The
  response's `id` is kept for the oracle (harness.oracles.request_ids).

A conversation is one client thread: its turns go one after another, each only once the previous
answer is back.
"""
from __future__ import annotations

from harness.targets.base import TargetError
from harness.targets.served.openai_wire import TOP_LOGPROBS, chat_ids_and_logprobs, error_message, stream_error

# the keys sent as headers and the turn ids, shared with the oracles that judge the answers
from harness.workloads.client import HEADERS, turn_rid

CHAT_PATH = "/v1/chat/completions"


def client_headers(body: dict) -> dict:
    """The headers a request asks for, taken out of its body (mutated)."""
    return {h: str(v) for k, h in HEADERS.items() if (v := body.pop(k, None)) is not None}


def chat_body(body: dict) -> dict:
    """A completions body as a chat body: no prompt, logprobs as the chat API asks for them."""
    # special tokens left out of the text (vLLM's default): the answer appended to the next turn is
    # what a chat client shows, and the surface oracle's text check decodes the ids the same way
    # (a model that says its end-of-turn token under ignore_eos would put it mid-text otherwise)
    drop = ("prompt", "chat", "logprobs", "echo", "prompt_logprobs", "skip_special_tokens")
    out = {k: v for k, v in body.items() if k not in drop}
    out.update(logprobs=True, top_logprobs=TOP_LOGPROBS)
    return out


def chat_prompt_ids(tok, messages: list[dict]) -> list[int] | None:
    """The prompt ids the server should build from `messages` (the model's chat template with the
    generation prompt, tokenized without special tokens added: vLLM's chat path), or None when
    the tokenizer has no template."""
    apply = getattr(tok, "apply_chat_template", None)
    if apply is None:
        return None
    return list(tok.encode(apply(messages)))


def send_conversation(target, client, base: str, r, body: dict, headers: dict) -> list[tuple]:
    """Every turn of one conversation on one server: [(rid@k, ids, finish, records)]. A turn the
    engine failed (5xx) ends the conversation there (an outcome to compare, as for a request)."""
    tok = target.tokenizer() if hasattr(target, "tokenizer") else None
    b, messages, out = chat_body(body), [], []
    for k, user in enumerate(body["chat"], 1):
        messages.append({"role": "user", "content": str(user)})
        rid = turn_rid(r.rid, k)
        resp = client.post(f"{base}{CHAT_PATH}", json={**b, "messages": list(messages)}, headers=headers or None)
        if resp.status_code >= 500:
            out.append((rid, [], f"server error {resp.status_code}: {error_message(resp)}", []))
            break
        if resp.status_code != 200:
            raise TargetError(f"{target.name}: request {rid} refused with {resp.status_code}: {error_message(resp)}")
        data = resp.json()
        if (err := stream_error(data)) is not None or not data.get("choices"):  # a dead engine's 200 (older vLLM)
            out.append((rid, [], err or f"server error 200 without choices: {resp.text[:200]}", []))
            break
        c = data["choices"][0]
        ids, lps = chat_ids_and_logprobs(c.get("logprobs"))
        text = (c.get("message") or {}).get("content") or ""
        sent = chat_prompt_ids(tok, messages) if tok is not None else None
        target.surface[rid] = {"text": text, "stop_reason": c.get("stop_reason"), "prompt_logprobs": None,
                               "usage": data.get("usage"), "request": r.rid, "choices": 1, "id": data.get("id"),
                               "turn": k, "prompt_ids": sent}
        out.append((rid, ids, c.get("finish_reason"), lps))
        messages.append({"role": "assistant", "content": text})
    return out
