"""The served targets' HTTP clients drop an idle connection before the engine's server closes it
(vLLM and SGLang: uvicorn, 5 s): a request sent on a pooled connection as the server closes it is
reset, which CI once saw as `httpx.ReadError: Connection reset by peer` from a live vLLM server."""
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from harness.targets.served import openai_wire


def _server():
    seen = []

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append(self.client_address[1])  # the client's port: one per connection
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *a):
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, seen


def test_an_idle_connection_is_dropped_before_the_engines_keep_alive_ends():
    srv, seen = _server()
    url = f"http://127.0.0.1:{srv.server_address[1]}/v1/completions"
    try:
        with openai_wire.client(10.0, 4) as c:
            c.post(url, json={})
            c.post(url, json={})  # at once: the pooled connection is used again
            time.sleep(openai_wire.KEEPALIVE_S + 0.5)
            c.post(url, json={})  # idle longer than our expiry (well short of 5 s): a new connection
    finally:
        srv.shutdown()
        srv.server_close()
    assert seen[0] == seen[1] and seen[2] != seen[1], seen
    assert openai_wire.KEEPALIVE_S < 5 / 2  # well inside the engines' own 5 s
