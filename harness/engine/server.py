"""An OpenAI-compatible HTTP server for the reference engine (`overlap-harness serve`).

One engine thread owns the Engine: it takes new requests from a queue, calls step() while
there is work, and hands every token (or the finish) back to the request's handle through
the engine's listener. HTTP handler threads (the standard library's ThreadingHTTPServer)
parse and validate, submit through the queue and wait on their handle; only the engine
thread ever touches the Engine.

Endpoints: POST /v1/completions, POST /v1/chat/completions (the model's chat template),
GET /v1/models, GET /health; and vLLM's /tokenize, /detokenize, /tokenizer_info, which
lm-eval's local-completions client detects and uses as its tokenizer.
Bad requests get a 400 with an OpenAI-style JSON error body; the server keeps serving.
"""
from __future__ import annotations

import itertools
import json
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from harness.engine.request import Request

MAX_N = 16
MAX_LOGPROBS = 5  # the engine returns the chosen token's log-probability and the top 5
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_BODY = 8 << 20


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


# -- the engine thread -----------------------------------------------------------------------
@dataclass
class Update:
    """What the engine thread tells a handler: new tokens, and the finish when it comes."""
    ids: list[int]
    logprobs: list
    finish: str | None = None
    error: str | None = None


@dataclass
class Handle:
    req: Request
    q: "queue.Queue[Update]" = field(default_factory=queue.Queue)
    sent: int = 0  # tokens already handed over (engine thread only)


class EngineThread(threading.Thread):
    """Owns the Engine; everything else talks to it through `inbox`."""

    def __init__(self, engine):
        super().__init__(name="engine", daemon=True)
        self.eng = engine
        self.inbox: queue.Queue = queue.Queue()
        self.handles: dict[int, Handle] = {}  # id(Request) -> handle (engine thread only)
        self.error: str | None = None
        self.served = 0
        self._halt = threading.Event()
        engine.listener = self._on_update

    # handler-thread side
    def submit(self, h: Handle) -> None:
        if self.error is not None:
            h.q.put(Update([], [], error=f"the engine crashed: {self.error}"))
            return
        self.inbox.put(("submit", h))

    def abort(self, h: Handle) -> None:
        self.inbox.put(("abort", h))

    def stop(self) -> None:
        self._halt.set()
        self.inbox.put(("wake", None))

    # engine-thread side
    def run(self) -> None:
        idle_synced = True
        while not self._halt.is_set():
            busy = self.eng.has_work()
            self._drain(block=not busy)
            if self._halt.is_set():
                break
            try:
                if self.eng.has_work():
                    self.eng.step()
                    idle_synced = False
                elif not idle_synced:
                    self.eng.dev.finish()  # run whatever is still queued before waiting
                    idle_synced = True
            except Exception as e:  # noqa: BLE001 - report the crash to every waiting client
                self._crash(f"{type(e).__name__}: {e}")
                return

    def _drain(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, h = item
            if kind == "submit":
                try:
                    self.eng.submit(h.req)
                    self.handles[id(h.req)] = h
                except ValueError as e:
                    h.q.put(Update([], [], error=str(e)))
            elif kind == "abort" and id(h.req) in self.handles:
                self.eng.abort(h.req)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _on_update(self, r: Request) -> None:
        h = self.handles.get(id(r))
        if h is None:
            return
        new, lps = r.output_ids[h.sent:], r.output_logprobs[h.sent:]
        h.sent = len(r.output_ids)
        fin = r.finish_reason if r.finished else None
        if fin is not None:
            del self.handles[id(r)]
            self.served += 1
        h.q.put(Update(list(new), list(lps), fin))

    def _crash(self, why: str) -> None:
        self.error = why
        print(f"overlap-harness serve: the engine crashed: {why}", file=sys.stderr)
        for h in list(self.handles.values()):
            h.q.put(Update([], [], error=f"the engine crashed: {why}"))
        self.handles.clear()
        while True:  # fail whatever was queued but not yet submitted
            try:
                kind, h = self.inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "submit":
                h.q.put(Update([], [], error=f"the engine crashed: {why}"))


# -- request parsing -----------------------------------------------------------------------
def _num(body: dict, name: str, default, lo: float, hi: float, integer: bool = False):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise BadRequest(f"'{name}' must be {'an integer' if integer else 'a number'}, got {json.dumps(v)}", name)
    if not lo <= v <= hi:
        raise BadRequest(f"'{name}' must be between {lo} and {hi}, got {v}", name)
    return v


def _stop_list(body: dict) -> tuple[str, ...]:
    s = body.get("stop")
    if s is None:
        return ()
    if isinstance(s, str):
        s = [s]
    if not isinstance(s, list) or not all(isinstance(x, str) and x for x in s):
        raise BadRequest("'stop' must be a non-empty string or a list of non-empty strings", "stop")
    return tuple(s)


@dataclass
class Params:
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    n: int
    stop: tuple[str, ...]
    stream: bool
    logprobs: int | None  # top alternatives per token, or None for no log-probabilities
    repetition_penalty: float
    ignore_eos: bool


def parse_params(body: dict, chat: bool) -> Params:
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise BadRequest(f"'{name}' is not supported (use 'repetition_penalty')", name)
    if body.get("echo") not in (None, False):
        raise BadRequest("'echo' is not supported: the server generates, it does not score prompts", "echo")
    if body.get("best_of") not in (None, 1):
        raise BadRequest("'best_of' is not supported", "best_of")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", "stream")
    mt = body.get("max_completion_tokens") if chat and body.get("max_tokens") is None else body.get("max_tokens")
    if mt is not None:
        mt = _num({"max_tokens": mt}, "max_tokens", None, 1, 1 << 20, integer=True)
    if chat:
        lp = body.get("logprobs", False)
        if not isinstance(lp, bool):
            raise BadRequest("'logprobs' must be a boolean for chat completions", "logprobs")
        top = _num(body, "top_logprobs", 0, 0, MAX_LOGPROBS, integer=True)
        logprobs = top if lp else None
    else:
        logprobs = _num(body, "logprobs", None, 0, MAX_LOGPROBS, integer=True)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest("'seed' must be an integer", "seed")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest("'ignore_eos' must be a boolean", "ignore_eos")
    return Params(max_tokens=mt, temperature=float(_num(body, "temperature", 1.0 if chat else 1.0, 0.0, 2.0)),
                  top_p=float(_num(body, "top_p", 1.0, 1e-9, 1.0)), seed=seed,
                  n=_num(body, "n", 1, 1, MAX_N, integer=True), stop=_stop_list(body), stream=stream,
                  logprobs=logprobs, repetition_penalty=float(_num(body, "repetition_penalty", 1.0, 1e-3, 100.0)),
                  ignore_eos=ignore_eos)


def _is_ids(x) -> bool:
    return isinstance(x, list) and len(x) > 0 and all(isinstance(t, int) and not isinstance(t, bool) for t in x)


def parse_prompts(body: dict) -> list:
    """The prompt field: a string, a list of strings, a list of token ids, or a list of those."""
    p = body.get("prompt")
    if isinstance(p, str):
        return [p]
    if _is_ids(p):
        return [p]
    if isinstance(p, list) and p and all(isinstance(x, str) or _is_ids(x) for x in p):
        return p
    raise BadRequest("'prompt' must be a string, a list of strings, a list of token ids or a list of those",
                     "prompt")


def parse_messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a 'role'", "messages")
        c = m.get("content")
        if isinstance(c, list):  # content parts: only text
            if not all(isinstance(x, dict) and x.get("type") == "text" and isinstance(x.get("text"), str)
                       for x in c):
                raise BadRequest(f"messages[{i}].content: only text parts are supported", "messages")
            c = "".join(x["text"] for x in c)
        if c is None:
            c = ""
        if not isinstance(c, str):
            raise BadRequest(f"messages[{i}].content must be a string or a list of text parts", "messages")
        out.append({"role": m["role"], "content": c})
    return out


# -- output text -------------------------------------------------------------------------------
def _cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def _safe_len(text: str, stop: tuple[str, ...]) -> int:
    """How much of unfinished text can be sent: hold back an incomplete character and any
    suffix that may be the start of a stop string."""
    n = len(text)
    while n and text[n - 1] == "\ufffd":
        n -= 1
    hold = 0
    for s in stop:
        for k in range(min(len(s) - 1, n), 0, -1):
            if text[n - k:n] == s[:k]:
                hold = max(hold, k)
                break
    return n - hold


class Choice:
    """One generated sequence as the handler sees it (handler thread only)."""

    def __init__(self, index: int, req: Request, tok, stop: tuple[str, ...]):
        self.index, self.req, self.tok, self.stop = index, req, tok, stop
        self.ids: list[int] = []
        self.lps: list = []
        self.finish: str | None = None
        self.error: str | None = None
        self.sent_chars = 0
        self.sent_tokens = 0
        self.hit_stop = False

    def take(self, u: Update) -> None:
        self.ids += u.ids
        self.lps += u.logprobs
        self.finish = u.finish or self.finish
        self.error = u.error or self.error

    @property
    def done(self) -> bool:
        return self.finish is not None or self.error is not None

    def text(self) -> str:
        t, self.hit_stop = _cut_at_stop(self.tok.decode(self.ids), self.stop)
        return t

    def finish_reason(self) -> str:
        if self.finish == "length" and not self.hit_stop:
            return "length"
        return "stop"

    def visible_tokens(self, text: str) -> int:
        """Tokens needed to produce `text` (the rest were past a stop string)."""
        if not self.hit_stop:
            return len(self.ids)
        for k in range(len(self.ids) + 1):
            if len(self.tok.decode(self.ids[:k])) >= len(text):
                return k
        return len(self.ids)


def _token_str(tok, t: int) -> str:
    """A token as a string; one that is not text on its own (a partial UTF-8 byte, a special
    token) is named so that distinct tokens keep distinct names in top_logprobs."""
    s = tok.decode([t])
    if s and "\ufffd" not in s:
        return s
    hf = getattr(tok, "tok", None)
    if hf is not None:
        return str(hf.convert_ids_to_tokens(int(t)))
    return f"bytes:\\x{t:02x}" if t < 256 else f"<|special:{t}|>"


def completion_logprobs(ch: Choice, k: int, start: int, end: int) -> dict:
    tok = ch.tok
    toks, lps, tops, offs = [], [], [], []
    for i in range(start, end):
        t = ch.ids[i]
        lp, top = ch.lps[i] if i < len(ch.lps) else (0.0, [])
        toks.append(_token_str(tok, t))
        lps.append(lp)
        tops.append({_token_str(tok, a): b for a, b in top[:k]} if k else None)
        offs.append(len(tok.decode(ch.ids[:i])))  # where the token's text starts in the completion
    out = {"tokens": toks, "token_logprobs": lps, "text_offset": offs}
    out["top_logprobs"] = tops if k else None
    return out


def chat_logprobs(ch: Choice, k: int, start: int, end: int) -> dict:
    tok = ch.tok
    content = []
    for i in range(start, end):
        t = ch.ids[i]
        lp, top = ch.lps[i] if i < len(ch.lps) else (0.0, [])
        s = _token_str(tok, t)
        content.append({"token": s, "logprob": lp, "bytes": list(s.encode("utf-8")),
                        "top_logprobs": [{"token": _token_str(tok, a), "logprob": b,
                                          "bytes": list(_token_str(tok, a).encode("utf-8"))} for a, b in top[:k]]})
    return {"content": content}


# -- the server ------------------------------------------------------------------------------
class Server:
    """The engine thread plus the HTTP server; start() serves in a background thread."""

    def __init__(self, engine, tok, model_name: str, host: str = "127.0.0.1", port: int = 0, quiet: bool = True):
        self.engine_thread = EngineThread(engine)
        self.tok, self.model_name = tok, model_name
        self.max_context = engine.L
        self.vocab = engine.mcfg.vocab_size
        self.quiet = quiet
        self.created = int(time.time())
        self._ids = itertools.count()
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"srv": self})
        self.httpd = _HTTPServer((host, port), handler)
        self.host, self.port = self.httpd.server_address[:2]
        self._http_thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "Server":
        self.engine_thread.start()
        self._http_thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                             name="http", daemon=True)
        self._http_thread.start()
        return self

    def serve_forever(self) -> None:
        self.engine_thread.start()
        try:
            self.httpd.serve_forever(poll_interval=0.2)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        if self._http_thread is not None:
            self.httpd.shutdown()
            self._http_thread.join(timeout=10)
            self._http_thread = None
        self.httpd.server_close()
        self.engine_thread.stop()
        if self.engine_thread.is_alive():
            self.engine_thread.join(timeout=30)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.shutdown()

    def next_id(self) -> int:
        with self._lock:
            return next(self._ids)

    # -- building requests ------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        ids = self.tok.encode(text)
        bos = getattr(self.tok, "bos_id", None)
        if bos is not None and (not ids or ids[0] != bos):
            ids = [bos] + ids  # the models here always see BOS first (as `run` gives it)
        return ids

    def prompt_ids(self, p) -> list[int]:
        if isinstance(p, str):
            if not p:
                raise BadRequest("'prompt' must not be empty", "prompt")
            return self.encode(p)
        bad = [t for t in p if not 0 <= t < self.vocab]
        if bad:
            raise BadRequest(f"token id {bad[0]} is outside the vocabulary (0..{self.vocab - 1})", "prompt")
        bos = getattr(self.tok, "bos_id", None)
        return [bos] + list(p) if bos is not None and p[0] != bos else list(p)

    def make_requests(self, prompts: list[list[int]], prm: Params, default_max: int | None) -> list[list[Request]]:
        base = self.next_id()
        check = self.engine_thread.eng.check_fits  # reads constants only: safe from a handler thread
        out = []
        for pi, ids in enumerate(prompts):
            probe = Request(rid="probe", prompt_ids=ids, max_new_tokens=1)
            if check(probe) is not None:
                raise BadRequest(f"the prompt ({len(ids)} tokens) does not fit: {check(probe)}", "prompt")
            if prm.max_tokens is not None:
                mt = prm.max_tokens
                if mt > self.max_context:
                    raise BadRequest(f"max_tokens {mt} exceeds this model's context of {self.max_context} "
                                     f"positions", "max_tokens")
                # more than the prompt leaves room for: cut to the room (finish_reason "length"), as
                # llama.cpp's server does, so a client with one max_tokens for all prompts works
                room = _largest_fit(check, Request(rid="probe", prompt_ids=ids, max_new_tokens=1), mt)
                mt = min(mt, room)
            else:  # the default: as many as fit (chat), or OpenAI's 16 (completions) if they fit
                room = _largest_fit(check, probe, self.max_context)
                mt = min(default_max or room, room)
            group = []
            for j in range(prm.n):
                seed = None if prm.seed is None else prm.seed + j
                r = Request(rid=f"srv{base}-{pi}-{j}", prompt_ids=ids, max_new_tokens=mt, stop=prm.stop,
                            temperature=prm.temperature, top_p=prm.top_p, seed=seed,
                            repetition_penalty=prm.repetition_penalty, ignore_eos=prm.ignore_eos)
                why = check(r)
                if why:
                    raise BadRequest(why, "max_tokens" if prm.max_tokens is not None else "prompt")
                group.append(r)
            out.append(group)
        return out


def _largest_fit(check, r: Request, hi: int) -> int:
    """The most new tokens r's prompt leaves room for (r fits with 1)."""
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        r.max_new_tokens = mid
        if check(r) is None:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many clients connect at once
    allow_reuse_address = True


class _Handler(BaseHTTPRequestHandler):
    srv: Server
    protocol_version = "HTTP/1.1"
    server_version = "overlap-harness"

    def log_message(self, fmt, *args):
        if not self.srv.quiet:
            super().log_message(fmt, *args)

    # -- plumbing ------------------------------------------------------------------------
    def _send_json(self, status: int, obj) -> None:
        data = json.dumps(obj).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, param: str | None = None, etype: str | None = None) -> None:
        etype = etype or ("invalid_request_error" if status < 500 else "server_error")
        self._send_json(status, {"error": {"message": message, "type": etype, "param": param, "code": status}})

    def _body(self) -> dict:
        te = self.headers.get("Transfer-Encoding", "")
        if "chunked" in te.lower():
            raw = self._read_chunked()
        else:
            try:
                n = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                raise BadRequest("bad Content-Length header") from None
            if n > MAX_BODY:
                raise BadRequest(f"request body over {MAX_BODY} bytes", status=413)
            raw = self.rfile.read(n) if n > 0 else b""
        if not raw:
            raise BadRequest("empty request body: expected a JSON object")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequest(f"the body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return body

    def _read_chunked(self) -> bytes:
        out = b""
        while True:
            line = self.rfile.readline(64)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise BadRequest("bad chunked body") from None
            if size == 0:
                self.rfile.readline(64)
                return out
            out += self.rfile.read(size)
            self.rfile.readline(64)
            if len(out) > MAX_BODY:
                raise BadRequest(f"request body over {MAX_BODY} bytes", status=413)

    def do_GET(self):
        path = self.path.split("?")[0].rstrip("/")
        s = self.srv
        if path == "/health":
            err = s.engine_thread.error
            if err is not None:
                return self._error(503, f"the engine crashed: {err}")
            return self._send_json(200, {"status": "ok", "model": s.model_name})
        if path == "/v1/models":
            return self._send_json(200, {"object": "list", "data": [
                {"id": s.model_name, "object": "model", "created": s.created, "owned_by": "overlap-harness",
                 "max_model_len": s.max_context}]})
        if path == "/tokenizer_info":
            return self._send_json(200, self._tokenizer_info())
        return self._error(404, f"no such endpoint: GET {path}")

    def _tokenizer_info(self) -> dict:
        tok = self.srv.tok
        hf = getattr(tok, "tok", None)

        def name(i):
            if i is None:
                return None
            if hf is not None:
                return hf.convert_ids_to_tokens(i)
            s = tok.decode([i])
            return s or None
        return {"eos_token": name(getattr(tok, "eos_id", None)), "bos_token": name(getattr(tok, "bos_id", None)),
                "pad_token": name(getattr(tok, "pad_id", None)), "chat_template": None,
                "model_max_length": self.srv.max_context, "tokenizer_class": type(tok).__name__}

    def do_POST(self):
        path = self.path.split("?")[0].rstrip("/")
        try:
            body = self._body()
            if path == "/v1/completions":
                return self._generate(body, chat=False)
            if path == "/v1/chat/completions":
                return self._generate(body, chat=True)
            if path == "/tokenize":
                p = body.get("prompt")
                if not isinstance(p, str):
                    raise BadRequest("'prompt' must be a string", "prompt")
                ids = self.srv.tok.encode(p)
                bos = getattr(self.srv.tok, "bos_id", None)
                if body.get("add_special_tokens", True) and bos is not None and (not ids or ids[0] != bos):
                    ids = [bos] + ids
                return self._send_json(200, {"tokens": ids, "count": len(ids), "max_model_len": self.srv.max_context})
            if path == "/detokenize":
                t = body.get("tokens")
                if not (isinstance(t, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in t)):
                    raise BadRequest("'tokens' must be a list of token ids", "tokens")
                return self._send_json(200, {"prompt": self.srv.tok.decode(t)})
            return self._error(404, f"no such endpoint: POST {path}")
        except BadRequest as e:
            return self._error(e.status, str(e), e.param)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - one bad request must not take the server down
            try:
                self._error(500, f"internal error: {type(e).__name__}: {e}")
            except OSError:
                self.close_connection = True

    def do_PUT(self):
        self._error(405, "method not allowed")

    do_DELETE = do_PATCH = do_PUT

    # -- generation ---------------------------------------------------------------------
    def _generate(self, body: dict, chat: bool) -> None:
        s = self.srv
        prm = parse_params(body, chat)
        if chat:
            text = s.tok.apply_chat_template(parse_messages(body))
            prompts = [s.encode(text)]
            default_max = None  # chat: up to the context
        else:
            prompts = [s.prompt_ids(p) for p in parse_prompts(body)]
            default_max = COMPLETIONS_DEFAULT_MAX_TOKENS
        groups = s.make_requests(prompts, prm, default_max)
        if s.engine_thread.error is not None:
            raise BadRequest(f"the engine crashed: {s.engine_thread.error}", status=503)
        choices, handles = [], []
        for group in groups:
            for r in group:
                h = Handle(r)
                choices.append(Choice(len(choices), r, s.tok, prm.stop))
                handles.append(h)
        for h in handles:
            s.engine_thread.submit(h)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{groups[0][0].rid}"
        meta = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": s.model_name}
        ptoks = sum(len(p) for p in prompts)
        if prm.stream:
            return self._stream(meta, choices, handles, prm, chat, ptoks, body)
        for ch, h in zip(choices, handles):
            while not ch.done:
                ch.take(h.q.get())
        err = next((c.error for c in choices if c.error), None)
        if err is not None:
            status = 503 if "crashed" in err else 400
            raise BadRequest(err, status=status)
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
                item["logprobs"] = (completion_logprobs(ch, prm.logprobs, 0, ntok)
                                    if prm.logprobs is not None else None)
            out.append(item)
        ctoks = sum(len(c.ids) for c in choices)
        self._send_json(200, {**meta, "choices": out, "usage": {
            "prompt_tokens": ptoks, "completion_tokens": ctoks, "total_tokens": ptoks + ctoks}})

    # -- streaming (server-sent events, chunked) ---------------------------------------------
    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, obj) -> None:
        self._chunk(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode("utf-8")) + b"\n\n")

    def _stream(self, meta, choices, handles, prm: Params, chat: bool, ptoks: int, body: dict) -> None:
        s = self.srv
        meta = {**meta, "object": "chat.completion.chunk" if chat else "text_completion"}
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        # one queue for all choices: a waiter thread per handle would be wasteful, so poll in turn
        try:
            if chat:
                for ch in choices:
                    self._event({**meta, "choices": [{"index": ch.index, "delta": {"role": "assistant", "content": ""},
                                                      "logprobs": None, "finish_reason": None}]})
            pending = list(zip(choices, handles))
            while pending:
                progressed = False
                for ch, h in list(pending):
                    try:
                        u = h.q.get(timeout=0.05 if len(pending) > 1 else 1.0)
                    except queue.Empty:
                        continue
                    progressed = True
                    ch.take(u)
                    while not h.q.empty():
                        ch.take(h.q.get_nowait())
                    if ch.error is not None:
                        self._event({"error": {"message": ch.error, "type": "server_error", "code": 503}})
                        pending.remove((ch, h))
                        continue
                    self._emit(meta, ch, prm, chat)
                    if ch.done:
                        pending.remove((ch, h))
                if not progressed:
                    continue
            opts = body.get("stream_options") or {}
            if isinstance(opts, dict) and opts.get("include_usage"):
                ctoks = sum(len(c.ids) for c in choices)
                self._event({**meta, "choices": [], "usage": {"prompt_tokens": ptoks, "completion_tokens": ctoks,
                                                              "total_tokens": ptoks + ctoks}})
            self._event(b"[DONE]")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            for ch, h in zip(choices, handles):
                if not ch.done:
                    s.engine_thread.abort(h)

    def _emit(self, meta, ch: Choice, prm: Params, chat: bool) -> None:
        text = ch.text()
        upto = len(text) if ch.done or ch.hit_stop else _safe_len(text, ch.stop)
        delta = text[ch.sent_chars:upto]
        ntok = ch.visible_tokens(text) if ch.hit_stop else len(ch.ids)
        lp = None
        if prm.logprobs is not None and (delta or ch.done) and ntok > ch.sent_tokens:
            if chat:
                lp = chat_logprobs(ch, prm.logprobs, ch.sent_tokens, ntok)
            else:
                lp = completion_logprobs(ch, prm.logprobs, ch.sent_tokens, ntok)
            ch.sent_tokens = ntok
        fin = ch.finish_reason() if ch.done else None
        if not delta and fin is None:
            return
        ch.sent_chars = upto
        if chat:
            item = {"index": ch.index, "delta": {"content": delta} if delta else {}, "logprobs": lp,
                    "finish_reason": fin}
        else:
            item = {"index": ch.index, "text": delta, "logprobs": lp, "finish_reason": fin}
        self._event({**meta, "choices": [item]})


# -- the command -------------------------------------------------------------------------------
def make_server(cfg, host: str = "127.0.0.1", port: int = 0, quiet: bool = True) -> Server:
    """Build the engine for an EngineConfig and an HTTP server around it (not started)."""
    from harness.cli import build
    eng, tok = build(cfg)
    eng.dev.keep_ops = False  # a long-lived server keeps no per-op records (they would grow forever)
    return Server(eng, tok, cfg.model, host, port, quiet)


def cmd_serve(a) -> int:
    from harness.cli import UsageError, engine_config
    cfg = engine_config(a)
    if not 0 <= a.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {a.port}")
    eng_srv = None
    try:
        eng_srv = make_server(cfg, a.host, a.port, quiet=not a.verbose)
    except OSError as e:
        raise UsageError(f"cannot listen on {a.host}:{a.port}: {e.strerror or e}") from None
    print(f"overlap-harness serve: model {cfg.model} on {eng_srv.url} (overlap {'on' if cfg.overlap else 'off'}, "
          f"policy {cfg.policy}, seed {cfg.seed}{', faults ' + ','.join(sorted(cfg.faults)) if cfg.faults else ''})",
          file=sys.stderr, flush=True)
    try:
        eng_srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def add_commands(sub) -> None:
    from harness.cli import add_engine_flags
    p = sub.add_parser("serve", help="serve the engine over an OpenAI-compatible HTTP API")
    add_engine_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--verbose", action="store_true", help="log every HTTP request")
    p.set_defaults(fn=cmd_serve)
