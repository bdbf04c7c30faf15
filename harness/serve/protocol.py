"""The OpenAI request and response formats: parsing and validating request bodies, and
turning generated tokens into completion / chat choices (text, stop strings, logprobs).

Everything here is plain data work, shared by the HTTP front end; nothing touches the engine.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from harness.engine.request import Request
from harness.validate import ParamError, check_sampling

MAX_N = 16
MAX_LOGPROBS = 5  # the engine returns the chosen token's log-probability and the top 5
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class ApiError(Exception):
    """A request the server refuses: becomes {"error": {message, type, param, code}} with `status`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.param, self.status, self.code, self.headers = param, status, code, headers




@dataclass
class Update:
    """What the engine thread tells a handler: new tokens, and the finish when it comes."""
    ids: list[int]
    logprobs: list
    finish: str | None = None
    error: str | None = None


# -- request parsing -----------------------------------------------------------------------
def _num(body: dict, name: str, default, lo: float, hi: float, integer: bool = False):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise ApiError(f"'{name}' must be {'an integer' if integer else 'a number'}, got {json.dumps(v)}", name)
    if not lo <= v <= hi:
        raise ApiError(f"'{name}' must be between {lo} and {hi}, got {v}", name)
    return v


def _stop_list(body: dict) -> tuple[str, ...]:
    s = body.get("stop")
    if s is None:
        return ()
    if isinstance(s, str):
        s = [s]
    if not isinstance(s, list) or not all(isinstance(x, str) and x for x in s):
        raise ApiError("'stop' must be a non-empty string or a list of non-empty strings", "stop")
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
            raise ApiError(f"'{name}' is not supported (use 'repetition_penalty')", name)
    if body.get("echo") not in (None, False):
        raise ApiError("'echo' is not supported: the server generates, it does not score prompts", "echo")
    if body.get("best_of") not in (None, 1):
        raise ApiError("'best_of' is not supported", "best_of")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError("'stream' must be a boolean", "stream")
    mt = body.get("max_completion_tokens") if chat and body.get("max_tokens") is None else body.get("max_tokens")
    try:  # the ranges the CLI applies to its flags too (one table: harness/validate.py)
        check_sampling({"max_tokens": mt, **{k: body.get(k) for k in ("temperature", "top_p", "repetition_penalty",
                                                                         "seed")}})
    except ParamError as e:
        raise ApiError(str(e), e.param) from None
    if chat:
        lp = body.get("logprobs", False)
        if not isinstance(lp, bool):
            raise ApiError("'logprobs' must be a boolean for chat completions", "logprobs")
        top = _num(body, "top_logprobs", 0, 0, MAX_LOGPROBS, integer=True)
        logprobs = top if lp else None
    else:
        logprobs = _num(body, "logprobs", None, 0, MAX_LOGPROBS, integer=True)
    seed = body.get("seed")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise ApiError("'ignore_eos' must be a boolean", "ignore_eos")
    return Params(max_tokens=mt, temperature=float(_num(body, "temperature", 1.0, 0.0, 2.0)),
                  top_p=float(_num(body, "top_p", 1.0, 0.0, 1.0)), seed=seed,
                  n=_num(body, "n", 1, 1, MAX_N, integer=True), stop=_stop_list(body), stream=stream,
                  logprobs=logprobs, repetition_penalty=float(_num(body, "repetition_penalty", 1.0, 0.0, 100.0)),
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
    raise ApiError("'prompt' must be a string, a list of strings, a list of token ids or a list of those",
                     "prompt")


def parse_messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(f"messages[{i}] must be an object with a 'role'", "messages")
        c = m.get("content")
        if isinstance(c, list):  # content parts: only text
            if not all(isinstance(x, dict) and x.get("type") == "text" and isinstance(x.get("text"), str)
                       for x in c):
                raise ApiError(f"messages[{i}].content: only text parts are supported", "messages")
            c = "".join(x["text"] for x in c)
        if c is None:
            c = ""
        if not isinstance(c, str):
            raise ApiError(f"messages[{i}].content must be a string or a list of text parts", "messages")
        out.append({"role": m["role"], "content": c})
    return out


# -- output text -------------------------------------------------------------------------------
def _cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def safe_len(text: str, stop: tuple[str, ...]) -> int:
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
        lp, top = (ch.lps[i] if i < len(ch.lps) else None) or (0.0, [])  # None: no record (speculative)
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
        lp, top = (ch.lps[i] if i < len(ch.lps) else None) or (0.0, [])  # None: no record (speculative)
        s = _token_str(tok, t)
        content.append({"token": s, "logprob": lp, "bytes": list(s.encode("utf-8")),
                        "top_logprobs": [{"token": _token_str(tok, a), "logprob": b,
                                          "bytes": list(_token_str(tok, a).encode("utf-8"))} for a, b in top[:k]]})
    return {"content": content}




# -- the body as JSON ----------------------------------------------------------------------------
MAX_DEPTH = 64  # nesting a request body may have; deeper is refused before anything walks it


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def parse_json_body(raw: bytes) -> dict:
    """The body as a JSON object, or an ApiError naming what is wrong with it. Covers what the
    parser itself can choke on (bad UTF-8, NaN / Infinity, deep nesting, huge integers) and
    strings that no tokenizer can encode (lone surrogates, which JSON's \\u escapes allow)."""
    if not raw:
        raise ApiError("empty request body: expected a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(f"the body is not valid UTF-8: {e.reason} at byte {e.start}") from None
    if _too_deep(text):
        raise ApiError(f"the body is nested deeper than {MAX_DEPTH} levels")
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, NaN, int digit limit
        raise ApiError(f"the body is not valid JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(body, dict):
        raise ApiError("the body must be a JSON object")
    bad = _lone_surrogate(body)
    if bad is not None:
        raise ApiError(f"'{bad}' holds a lone UTF-16 surrogate: not valid Unicode text", bad)
    return body


def _too_deep(text: str) -> bool:
    """Bracket depth outside strings, counted without recursion (the parser recurses)."""
    depth, in_str, esc = 0, False, False
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False
    for c in text:
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif c in "]}":
            depth -= 1
    return False


def _lone_surrogate(obj, path: str = "") -> str | None:
    """The top-level field that holds a string with a lone surrogate, or None."""
    stack = [(obj, path)]
    while stack:
        o, p = stack.pop()
        if isinstance(o, str):
            try:
                o.encode("utf-8")
            except UnicodeEncodeError:
                return p or "body"
        elif isinstance(o, dict):
            for k, v in o.items():
                if isinstance(k, str) and not _encodable(k):
                    return p or "body"
                stack.append((v, p or str(k)))
        elif isinstance(o, list):
            stack.extend((v, p) for v in o)
    return None


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False
