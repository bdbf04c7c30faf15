"""The OpenAI-compatible routes (Starlette) over the engine thread.

POST /v1/completions, POST /v1/chat/completions (the model's chat template), GET /v1/models,
GET /v1/models/{id}, GET /health, GET /metrics (Prometheus text); and vLLM's /tokenize,
/detokenize and /tokenizer_info, which lm-eval's local-completions detects and uses as its
tokenizer. Handlers read the raw body themselves: the limits, the error messages and the
codec checks are ours, in protocol.py. Plain Starlette rather than FastAPI: with no pydantic
models to validate, FastAPI's extra layers only cost time (~0.4 ms a request, measured).
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from harness.serve.engine_thread import Handle
from harness.serve.http import error_body
from harness.serve.protocol import (COMPLETIONS_DEFAULT_MAX_TOKENS, ApiError, Choice, Params, safe_len,
                                    chat_logprobs, completion_logprobs, parse_json_body, parse_messages,
                                    parse_params, parse_prompts)

log = logging.getLogger("overlap_harness.serve")
SHUTTING_DOWN = "the server is shutting down"
GONE = -1  # the choice index that tells a waiting handler its client disconnected


class ClientGone(Exception):
    """The client closed its connection before the answer was complete."""


def _json_error(status: int, message: str, param=None, code=None, headers=None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


async def read_body(request: Request, limit: int, timeout: float) -> dict:
    """The body, counted as it arrives (chunked or not) and refused as soon as it passes the
    limit; each part must arrive within `timeout` seconds."""
    buf = bytearray()
    while True:
        try:
            msg = await asyncio.wait_for(request.receive(), timeout)
        except asyncio.TimeoutError:
            raise ApiError(f"the request body stopped arriving (nothing for {timeout:g} s)", status=408) from None
        if msg["type"] == "http.disconnect":
            raise ClientGone()
        buf += msg.get("body", b"")
        if len(buf) > limit:
            raise ApiError(f"request body over the limit of {limit} bytes", status=413)
        if not msg.get("more_body", False):
            break
    return parse_json_body(bytes(buf))


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def build_app(front) -> Starlette:
    """`front` is the Server (server.py): tokenizer, model name, engine thread, metrics, limits."""
    routes: list[Route] = []

    def route(path: str, method: str):
        def register(fn):
            async def endpoint(request: Request):
                out = await fn(request)
                return out if isinstance(out, Response) else JSONResponse(out)
            routes.append(Route(path, endpoint, methods=[method]))  # GET routes answer HEAD too
            return fn
        return register

    async def _api_error(request: Request, e: ApiError):
        return _json_error(e.status, str(e), e.param, e.code, e.headers)

    async def _http_error(request: Request, e: StarletteHTTPException):
        if e.status_code == 404:
            msg = f"no such endpoint: {request.method} {request.url.path}"
        elif e.status_code == 405:
            msg = f"method {request.method} is not allowed on {request.url.path}"
        else:
            msg = str(e.detail)
        return _json_error(e.status_code, msg, headers=getattr(e, "headers", None))

    async def _internal(request: Request, e: Exception):
        log.error("internal error on %s %s: %s: %s", request.method, request.url.path, type(e).__name__, e)
        return _json_error(500, f"internal error: {type(e).__name__}: {e}")

    def authorize(request: Request) -> None:
        key = front.api_key
        if key is None:
            return
        got = request.headers.get("authorization", "")
        if not (got.startswith("Bearer ") and hmac.compare_digest(got[7:].strip().encode(), key.encode())):
            raise ApiError("missing or wrong API key: send 'Authorization: Bearer <key>'", status=401,
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def model_card() -> dict:
        return {"id": front.model_name, "object": "model", "created": front.created, "owned_by": "overlap-harness",
                "max_model_len": front.max_context}

    def check_model(body: dict) -> None:
        m = body.get("model")
        if m is None:
            return
        if not isinstance(m, str):
            raise ApiError("'model' must be a string", "model")
        if m != front.model_name:
            raise ApiError(f"the model '{m}' does not exist: this server serves '{front.model_name}'", "model",
                           status=404, code="model_not_found")

    @route("/health", "GET")
    async def health(request: Request):
        err = front.engine_thread.error
        if err is not None:
            raise ApiError(f"the engine crashed: {err}", status=503)
        return {"status": "ok", "model": front.model_name}

    @route("/metrics", "GET")
    async def metrics(request: Request):
        data, ctype = front.metrics.render()
        return Response(data, media_type=ctype)

    @route("/v1/models", "GET")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [model_card()]}

    @route("/v1/models/{model_id:path}", "GET")
    async def model(request: Request):
        authorize(request)
        model_id = request.path_params["model_id"]
        if model_id != front.model_name:
            raise ApiError(f"the model '{model_id}' does not exist: this server serves '{front.model_name}'",
                           "model", status=404, code="model_not_found")
        return model_card()

    @route("/tokenizer_info", "GET")
    async def tokenizer_info(request: Request):
        return front.tokenizer_info()

    @route("/tokenize", "POST")
    async def tokenize(request: Request):
        body = await read_body(request, front.max_body, front.body_timeout)
        p = body.get("prompt")
        if not isinstance(p, str):
            raise ApiError("'prompt' must be a string", "prompt")
        ids = front.tokenize(p, "prompt")
        if body.get("add_special_tokens", True) is False and front.bos is not None and ids[:1] == [front.bos]:
            ids = ids[1:]
        return {"tokens": ids, "count": len(ids), "max_model_len": front.max_context}

    @route("/detokenize", "POST")
    async def detokenize(request: Request):
        body = await read_body(request, front.max_body, front.body_timeout)
        t = body.get("tokens")
        if not (isinstance(t, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in t)):
            raise ApiError("'tokens' must be a list of token ids", "tokens")
        bad = [x for x in t if not 0 <= x < front.vocab]
        if bad:
            raise ApiError(f"token id {bad[0]} is outside the vocabulary (0..{front.vocab - 1})", "tokens")
        return {"prompt": front.tok.decode(t)}

    @route("/v1/completions", "POST")
    async def completions(request: Request):
        return await generate(request, chat=False)

    @route("/v1/chat/completions", "POST")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    async def generate(request: Request, chat: bool):
        authorize(request)
        try:
            body = await read_body(request, front.max_body, front.body_timeout)
        except ClientGone:
            return Response(status_code=499)
        check_model(body)
        prm = parse_params(body, chat)
        if chat:
            try:
                text = front.tok.apply_chat_template(parse_messages(body))
            except ApiError:
                raise
            except Exception as e:  # noqa: BLE001 - a template that cannot render these messages
                raise ApiError(f"the chat template cannot render these messages: {e}", "messages") from None
            prompts = [front.tokenize(text, "messages")]
            default_max = None  # chat: up to the context
        else:
            prompts = [front.prompt_ids(p) for p in parse_prompts(body)]
            default_max = COMPLETIONS_DEFAULT_MAX_TOKENS
        groups = front.make_requests(prompts, prm, default_max)
        if front.engine_thread.error is not None:
            raise ApiError(f"the engine crashed: {front.engine_thread.error}", status=503)
        if front.closing:
            raise ApiError(SHUTTING_DOWN, status=503)
        q: asyncio.Queue = asyncio.Queue()
        choices, handles = [], []
        for group in groups:
            for r in group:
                handles.append(Handle(r, q, index=len(choices)))
                choices.append(Choice(len(choices), r, front.tok, prm.stop))
        for h in handles:
            front.engine_thread.submit(h)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{groups[0][0].rid}"
        meta = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": front.model_name}
        ptoks = sum(len(p) for p in prompts)
        if prm.stream:
            return StreamingResponse(_stream(front, request, meta, choices, handles, q, prm, chat, ptoks, body),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return await _complete(front, request, meta, choices, handles, q, prm, chat, ptoks)

    return Starlette(routes=routes, exception_handlers={ApiError: _api_error, StarletteHTTPException: _http_error,
                                                        Exception: _internal})


def _abort_unfinished(front, request: Request, choices, handles, why: str) -> None:
    left = [h for ch, h in zip(choices, handles) if not ch.done]
    for h in left:
        front.engine_thread.abort(h)
    if left:
        front.metrics.disconnects.inc()
        client = request.client
        log.info("client %s went away during %s %s (%s): aborted %d unfinished request(s)",
                 f"{client.host}:{client.port}" if client else "?", request.method, request.url.path, why,
                 len(left))


async def _complete(front, request, meta, choices, handles, q, prm: Params, chat: bool, ptoks: int):
    async def watch() -> None:  # the client going away shows up in the same queue as the tokens
        await _until_disconnect(request)
        q.put_nowait((GONE, None))

    watcher = asyncio.ensure_future(watch())
    try:
        left = len(choices)
        while left:
            i, u = await q.get()
            if i == GONE:
                _abort_unfinished(front, request, choices, handles, "non-streaming")
                return Response(status_code=499)  # nobody reads it: the connection is gone
            was_done = choices[i].done
            choices[i].take(u)
            left -= choices[i].done and not was_done
    finally:
        watcher.cancel()
    err = next((c.error for c in choices if c.error), None)
    if err is not None:
        status = 503 if ("crashed" in err or err == SHUTTING_DOWN) else 400
        raise ApiError(err, status=status)
    out = []
    for ch in choices:
        text = ch.text()
        ntok = ch.visible_tokens(text)
        item = {"index": ch.index, "finish_reason": ch.finish_reason()}
        if chat:
            item["message"] = {"role": "assistant", "content": text}
            item["logprobs"] = chat_logprobs(ch, prm.logprobs, 0, ntok) if prm.logprobs is not None else None
        else:
            item["text"] = text
            item["logprobs"] = completion_logprobs(ch, prm.logprobs, 0, ntok) if prm.logprobs is not None else None
        out.append(item)
    ctoks = sum(len(c.ids) for c in choices)
    return JSONResponse({**meta, "choices": out, "usage": {"prompt_tokens": ptoks, "completion_tokens": ctoks,
                                                           "total_tokens": ptoks + ctoks}})


def _event(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode("utf-8")) + b"\n\n"


async def _stream(front, request, meta, choices, handles, q, prm: Params, chat: bool, ptoks: int, body: dict):
    """Server-sent events. Starlette cancels this generator when the client disconnects; the
    `finally` then aborts what is still generating."""
    meta = {**meta, "object": "chat.completion.chunk" if chat else "text_completion"}
    complete = False
    try:
        if chat:
            for ch in choices:
                yield _event({**meta, "choices": [{"index": ch.index, "delta": {"role": "assistant", "content": ""},
                                                   "logprobs": None, "finish_reason": None}]})
        ended: set[int] = set()  # choices whose finish or error has been sent
        while len(ended) < len(choices):
            i, u = await q.get()
            touched = {i}
            choices[i].take(u)
            while not q.empty():  # take everything already delivered: one event per choice per round
                j, v = q.get_nowait()
                choices[j].take(v)
                touched.add(j)
            for j in sorted(touched):
                ch = choices[j]
                if j in ended:
                    continue
                if ch.error is not None:
                    ended.add(j)
                    code = 503 if ("crashed" in ch.error or ch.error == SHUTTING_DOWN) else 400
                    yield _event(error_body(code, ch.error))
                    continue
                ev = _emit(meta, ch, prm, chat)
                if ev is not None:
                    yield _event(ev)
                if ch.finish is not None:
                    ended.add(j)
        opts = body.get("stream_options") or {}
        if isinstance(opts, dict) and opts.get("include_usage"):
            ctoks = sum(len(c.ids) for c in choices)
            yield _event({**meta, "choices": [], "usage": {"prompt_tokens": ptoks, "completion_tokens": ctoks,
                                                           "total_tokens": ptoks + ctoks}})
        yield _event(b"[DONE]")
        complete = True
    finally:
        if not complete:
            _abort_unfinished(front, request, choices, handles, "streaming")


def _emit(meta, ch: Choice, prm: Params, chat: bool) -> dict | None:
    text = ch.text()
    upto = len(text) if ch.done or ch.hit_stop else safe_len(text, ch.stop)
    delta = text[ch.sent_chars:upto]
    ntok = ch.visible_tokens(text) if ch.hit_stop else len(ch.ids)
    lp = None
    if prm.logprobs is not None and (delta or ch.done) and ntok > ch.sent_tokens:
        lp = (chat_logprobs if chat else completion_logprobs)(ch, prm.logprobs, ch.sent_tokens, ntok)
        ch.sent_tokens = ntok
    fin = ch.finish_reason() if ch.done else None
    if not delta and fin is None:
        return None
    ch.sent_chars = upto
    if chat:
        item = {"index": ch.index, "delta": {"content": delta} if delta else {}, "logprobs": lp, "finish_reason": fin}
    else:
        item = {"index": ch.index, "text": delta, "logprobs": lp, "finish_reason": fin}
    return {**meta, "choices": [item]}
