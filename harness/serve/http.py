"""The HTTP edge of `serve`: what uvicorn and the app do not do by themselves.

- Every error is the OpenAI schema, {"error": {"message", "type", "param", "code"}}, with a
  one-line message, including the ones uvicorn answers on its own (an unparsable request,
  headers that never finish).
- A body is counted as it arrives: a Content-Length over the limit is refused before a byte is
  read, a chunked body as soon as it passes the limit; nothing buffers it whole first.
- A response sent before the request's body was read to the end closes the connection, so
  the unread bytes can never be parsed as the next request (request smuggling).
- A connection that never finishes its request head is answered 408 and closed (uvicorn only
  times out idle keep-alive connections), a head over 64 KiB is 431; a body that stops
  arriving is 408 too (see app.py).
"""
from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
               413: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error"}
MAX_BODY = 8 << 20  # bytes a request body may have


def error_body(status: int, message: str, param: str | None = None, code: str | int | None = None,
               etype: str | None = None) -> dict:
    message = " ".join(str(message).split("\n")).strip() or "error"  # always one line
    return {"error": {"message": message, "type": etype or ERROR_TYPES.get(status, "server_error"
                                                                            if status >= 500 else
                                                                            "invalid_request_error"),
                      "param": param, "code": code if code is not None else status}}


def raw_error(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 error response that closes the connection, for the protocol layer,
    where no ASGI app runs."""
    data = json.dumps(error_body(status, message)).encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, reason.encode(), len(data)) + data)


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol (llhttp, a C parser that refuses ambiguous framing) with
    JSON protocol errors, a deadline and a size limit for the request head. `head_timeout`
    is set per server (a subclass made by make_protocol)."""

    head_timeout = 10.0
    max_head = 64 * 1024  # bytes of request line and headers (httptools itself has no limit)

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = None
        self._in_head, self._head_bytes = True, 0
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def on_message_begin(self) -> None:  # the first byte of a request: its head must follow in time
        super().on_message_begin()
        self._in_head, self._head_bytes = True, 0
        self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.max_head:
                self._refuse(431, "Request Header Fields Too Large",
                             f"the request head is over {self.max_head} bytes")

    def connection_lost(self, exc) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._refuse(408, "Request Timeout", f"the request head did not arrive within {self.head_timeout:g} s")

    def _refuse(self, status: int, reason: str, message: str) -> None:
        self._cancel_head_timer()
        self.transport.write(raw_error(status, reason, message))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, "Bad Request", f"{msg.rstrip('.')}: not a valid HTTP/1.1 request")


def make_protocol(head_timeout: float) -> type:
    return type("GuardedHttpTools", (GuardedHttpTools,), {"head_timeout": head_timeout})


class Guard:
    """ASGI middleware around the app: the body limit on Content-Length, `Connection: close`
    on any response sent before the body was read to its end, and error counting."""

    def __init__(self, app, max_body: int = MAX_BODY, on_error=None):
        self.app, self.max_body, self.on_error = app, max_body, on_error

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cl = te = None
        for k, v in scope["headers"]:
            if k == b"content-length":
                cl = v
            elif k == b"transfer-encoding":
                te = v
        body_done = te is None and (cl is None or cl.strip() == b"0")
        if cl is not None and te is None:
            try:
                n = int(cl)
            except ValueError:
                n = -1
            if n > self.max_body:  # refused before a byte of it is read
                return await self._refuse(send, 413, f"request body of {n} bytes is over the limit of "
                                                     f"{self.max_body} bytes")

        async def rcv():
            nonlocal body_done
            msg = await receive()
            if msg["type"] == "http.request" and not msg.get("more_body", False):
                body_done = True
            return msg

        async def snd(msg):
            if msg["type"] == "http.response.start":
                if msg["status"] >= 400 and self.on_error is not None:
                    self.on_error(msg["status"])
                if not body_done:  # the rest of the body must not be read as a request
                    msg = {**msg, "headers": [*msg.get("headers", []), (b"connection", b"close")]}
            await send(msg)

        await self.app(scope, rcv, snd)

    async def _refuse(self, send, status: int, message: str) -> None:
        if self.on_error is not None:
            self.on_error(status)
        data = json.dumps(error_body(status, message)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": data})
