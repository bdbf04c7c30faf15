"""The server object: the engine thread, the app, and uvicorn serving it.

`start()` serves from a background thread (tests, benchmarks, the gsm8k pairs); `serve_forever()`
serves from the main thread, where uvicorn takes SIGTERM / SIGINT for a graceful shutdown:
stop accepting, end every request in flight with an error (a stream gets an error event), and
return within `grace` seconds.
"""
from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time

import uvicorn

from harness.engine.request import Request
from harness.serve.app import SHUTTING_DOWN, build_app
from harness.serve.engine_thread import EngineThread
from harness.serve.http import MAX_BODY, Guard, make_protocol
from harness.serve.metrics import Metrics
from harness.serve.protocol import ApiError, Params

GRACE_S = 5  # a graceful shutdown waits this long for the requests it ended to say so


class _Uvicorn(uvicorn.Server):
    """uvicorn, plus: fail what is in flight the moment a shutdown begins (uvicorn itself would
    wait for every open request to finish, or cut it without a word after the grace period)."""

    front: "Server"

    async def startup(self, sockets=None) -> None:
        self.front.engine_thread.loop = asyncio.get_running_loop()
        await super().startup(sockets)

    async def shutdown(self, sockets=None) -> None:
        self.front.closing = True
        self.front.engine_thread.close(SHUTTING_DOWN)
        await super().shutdown(sockets)


class Server:
    def __init__(self, engine, tok, model_name: str, host: str = "127.0.0.1", port: int = 0, quiet: bool = True,
                 api_key: str | None = None, max_body: int = MAX_BODY, body_timeout: float = 30.0,
                 head_timeout: float = 10.0, keep_alive: int = 5, grace: int = GRACE_S):
        self.metrics = Metrics(model_name)
        self.engine_thread = EngineThread(engine, self.metrics)
        self.tok, self.model_name = tok, model_name
        self.max_context = engine.L
        self.vocab = engine.mcfg.vocab_size
        self.bos = getattr(tok, "bos_id", None)
        self.api_key = api_key
        self.max_body, self.body_timeout = max_body, body_timeout
        self.quiet = quiet
        self.closing = False
        self.created = int(time.time())
        self._ids = itertools.count()
        app = Guard(build_app(self), max_body, on_error=lambda st: self.metrics.http_errors.labels(status=str(st)).inc())
        config = uvicorn.Config(app, host=host, port=port, http=make_protocol(head_timeout), ws="none",
                                lifespan="off", log_config=None, log_level="info" if not quiet else "warning",
                                access_log=not quiet, timeout_keep_alive=keep_alive, timeout_graceful_shutdown=grace,
                                backlog=512)
        self.uv = _Uvicorn(config)
        self.uv.front = self
        # bind now: the port is known before serving, and a busy port fails here, in the caller
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(fam, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
            self.sock.listen(512)
        except OSError:
            self.sock.close()
            raise
        self.host, self.port = self.sock.getsockname()[:2]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- running ----------------------------------------------------------------------------
    def start(self) -> "Server":
        """Serve from a background thread; returns once the server accepts connections."""
        self.engine_thread.start()
        self._thread = threading.Thread(target=lambda: asyncio.run(self.uv.serve(sockets=[self.sock])),
                                        name="http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.uv.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.01)
        return self

    def serve_forever(self) -> None:
        """Serve from this (the main) thread until SIGTERM / SIGINT."""
        self.engine_thread.start()
        try:
            asyncio.run(self.uv.serve(sockets=[self.sock]))
        finally:
            self._stop_engine()

    def shutdown(self) -> None:
        if self._thread is not None:
            self.uv.should_exit = True
            self._thread.join(timeout=30)
            self._thread = None
        self._stop_engine()

    def close_socket(self) -> None:
        """Release the port of a server that was never started."""
        self.sock.close()

    def _stop_engine(self) -> None:
        self.sock.close()
        self.engine_thread.stop()
        if self.engine_thread.is_alive():
            self.engine_thread.join(timeout=30)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.shutdown()

    # -- building requests (event-loop side; reads the engine's constants only) -------------
    def tokenize(self, text: str, param: str) -> list[int]:
        """Token ids with BOS first (the models here always see it, as `run` gives it)."""
        try:
            ids = list(self.tok.encode(text))
        except Exception as e:  # noqa: BLE001 - whatever the tokenizer or the codec refuses is the client's
            raise ApiError(f"'{param}' cannot be tokenized: {type(e).__name__}: {e}", param) from None
        if self.bos is not None and (not ids or ids[0] != self.bos):
            ids = [self.bos] + ids
        return ids

    def prompt_ids(self, p) -> list[int]:
        if isinstance(p, str):
            if not p:
                raise ApiError("'prompt' must not be empty", "prompt")
            return self.tokenize(p, "prompt")
        bad = [t for t in p if not 0 <= t < self.vocab]
        if bad:
            raise ApiError(f"token id {bad[0]} is outside the vocabulary (0..{self.vocab - 1})", "prompt")
        return [self.bos] + list(p) if self.bos is not None and p[0] != self.bos else list(p)

    def next_id(self) -> int:
        return next(self._ids)  # the event loop is one thread

    def make_requests(self, prompts: list[list[int]], prm: Params, default_max: int | None) -> list[list[Request]]:
        base = self.next_id()
        check = self.engine_thread.eng.check_fits  # reads constants only: safe off the engine thread
        out = []
        for pi, ids in enumerate(prompts):
            probe = Request(rid="probe", prompt_ids=ids, max_new_tokens=1)
            if check(probe) is not None:
                raise ApiError(f"the prompt ({len(ids)} tokens) does not fit: {check(probe)}", "prompt")
            if prm.max_tokens is not None:
                mt = prm.max_tokens
                if mt > self.max_context:
                    raise ApiError(f"max_tokens {mt} exceeds this model's context of {self.max_context} positions",
                                   "max_tokens")
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
                    raise ApiError(why, "max_tokens" if prm.max_tokens is not None else "prompt")
                group.append(r)
            out.append(group)
        return out

    def tokenizer_info(self) -> dict:
        tok = self.tok
        hf = getattr(tok, "tok", None)

        def name(i):
            if i is None:
                return None
            if hf is not None:
                return hf.convert_ids_to_tokens(i)
            return tok.decode([i]) or None
        return {"eos_token": name(getattr(tok, "eos_id", None)), "bos_token": name(self.bos),
                "pad_token": name(getattr(tok, "pad_id", None)), "chat_template": None,
                "model_max_length": self.max_context, "tokenizer_class": type(tok).__name__}


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


def make_server(cfg, host: str = "127.0.0.1", port: int = 0, quiet: bool = True, **kw) -> Server:
    """Build the engine for an EngineConfig and a server around it (not started)."""
    from harness.flags import build
    eng, tok = build(cfg)
    return Server(eng, tok, cfg.model, host, port, quiet, **kw)
