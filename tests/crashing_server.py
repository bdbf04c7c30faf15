"""A stand-in OpenAI completions server for the CRASH tests: /health answers 200; a completion
echoes the prompt's first ids back (logprobs in vLLM's "token_id:N" shape). With
STAND_IN_CRASH=1 the first completion kills the process the way an engine core's exception
does: its traceback on stderr, then exit code 7. With STAND_IN_CRASH=dead-engine the process
lives on, as vLLM's API server does when its engine core died: the traceback, then 500 to every
completion and to /health. With STAND_IN_POISON=crash (or hang) only a completion whose prompt
holds id 13 kills the process (or never answers, its progress counter still; rank-hang: after a
pipeline stage's tagged traceback in the log): one case dies,
the others are served; with STAND_IN_POISON=penalty, a completion with a repetition penalty
kills it (a live known bug's trigger). STAND_IN_DELAY_S=X makes every completion take X seconds.

    python crashing_server.py --port P
"""
import json
import os
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def schedule_step(batch):
    raise RuntimeError("stand-in engine: step 3 found a placeholder in the input ids")


def apply_penalties(batch):
    raise RuntimeError("index -1 is out of bounds for dimension 1 with size 49153")


def embed(ids):
    for i in ids:
        if i < 0:
            raise IndexError("index out of range in self")


POISON = 13  # a prompt holding this id is the case that kills the engine (STAND_IN_POISON=crash|hang)
_TOKENS = [0]


def _facts(n: int) -> None:
    """An agent's progress counter (tokens delivered, token period) where the target's plan says
    facts go, so the target's watchdog can tell a stall (STAND_IN_POISON=hang) from slowness."""
    plan = os.environ.get("OVERLAP_HARNESS_AGENT_PLAN")
    if not plan:
        return
    _TOKENS[0] += n
    d = json.load(open(plan))["facts_dir"]
    with open(os.path.join(d, f"stand-in-{os.getpid()}.json"), "w") as f:
        json.dump({"tokens_out": _TOKENS[0], "token_period_ms": 10.0, "steps": _TOKENS[0]}, f)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    dead = False
    core = threading.Lock()  # one engine core: it dies once, its traceback whole

    def do_GET(self):
        self.send_response((500 if Handler.dead else 200) if self.path == "/health" else 404)
        self.end_headers()

    def _500(self):
        if os.environ.get("STAND_IN_DEAD_ANSWER") == "200":  # as older vLLM releases answer: 200, an error object
            data = json.dumps({"object": "error", "message": "EngineCore encountered an issue", "code": 500}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return self.wfile.write(data)
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if Handler.dead:
            return self._500()
        if os.environ.get("STAND_IN_CRASH") == "dead-engine":
            try:
                schedule_step(body)
            except RuntimeError:
                traceback.print_exc()
                sys.stderr.flush()
                Handler.dead = True
                return self._500()
        poison = POISON in body["prompt"]
        if poison and os.environ.get("STAND_IN_POISON") in ("hang", "rank-hang"):
            if os.environ.get("STAND_IN_POISON") == "rank-hang":  # a pipeline stage raised, nobody reads its reply
                try:
                    embed([-1])
                except IndexError:
                    tag = f"(Worker_PP0 pid={os.getpid()}) ERROR 12-07 18:43:15 [multiproc_executor.py:1063] "
                    sys.stderr.write("".join(tag + ln + "\n" for ln in traceback.format_exc().splitlines()))
                    sys.stderr.flush()
            _facts(0)
            time.sleep(3600)  # the engine stops delivering tokens: the watchdog's HANG
        if os.environ.get("STAND_IN_POISON") == "penalty" and body.get("repetition_penalty", 1.0) != 1.0:
            with Handler.core:
                try:
                    apply_penalties(body)
                except RuntimeError:
                    traceback.print_exc()
                    sys.stderr.flush()
                    os._exit(7)
        if os.environ.get("STAND_IN_CRASH") == "1" or (poison and os.environ.get("STAND_IN_POISON") == "crash"):
            with Handler.core:
                try:
                    schedule_step(body)
                except RuntimeError:
                    sys.stderr.write("ERROR 12-02 14:00:00 [core.py:1] EngineCore encountered a fatal error.\n")
                    traceback.print_exc()
                    sys.stderr.flush()
                    os._exit(7)
        time.sleep(float(os.environ.get("STAND_IN_DELAY_S", "0")))  # a slow engine: a case stays in flight
        ids = list(body["prompt"])[:body["max_tokens"]]
        out = {"choices": [{"index": 0, "finish_reason": "length", "logprobs": {
            "tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.1] * len(ids),
            "top_logprobs": [{f"token_id:{i}": -0.1} for i in ids]}}]}
        _facts(len(ids))
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    port = int(sys.argv[sys.argv.index("--port") + 1])
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
