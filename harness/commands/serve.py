"""`overlap-harness serve`: the flags and the command. Imports the HTTP stack only when run,
so building the CLI's parser stays cheap."""
from __future__ import annotations

import logging
import signal
import sys

SMOLLM2_CONTEXT = 2048  # lm-eval assumes 2048 and does not read max_model_len: its 5-shot GSM8K must fit


def cmd_serve(a) -> int:
    from harness.flags import UsageError, engine_config
    if not 0 <= a.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {a.port}")
    if a.api_key is not None and not a.api_key.strip():
        raise UsageError("--api-key must not be empty")
    if a.max_body < 1024:
        raise UsageError(f"--max-body must be at least 1024 bytes, got {a.max_body}")
    if not a.timeout > 0:
        raise UsageError(f"--timeout must be positive, got {a.timeout}")
    if a.model == "smollm2" and a.max_context is None:
        a.max_context = SMOLLM2_CONTEXT
        a.max_prefill_tokens = max(a.max_prefill_tokens, SMOLLM2_CONTEXT)
    cfg = engine_config(a)
    from harness.serve.server import make_server
    try:
        srv = make_server(cfg, a.host, a.port, quiet=not a.verbose, api_key=a.api_key, max_body=a.max_body,
                          body_timeout=a.timeout, head_timeout=a.timeout)
    except OSError as e:
        raise UsageError(f"cannot listen on {a.host}:{a.port}: {e.strerror or e}") from None
    logging.basicConfig(level=logging.INFO, format="overlap-harness serve: %(message)s", stream=sys.stderr)
    print(f"overlap-harness serve: model {cfg.model} on {srv.url} (overlap {'on' if cfg.overlap else 'off'}, "
          f"policy {cfg.policy}, seed {cfg.seed}, context {srv.max_context}"
          f"{', faults ' + ','.join(sorted(cfg.faults)) if cfg.faults else ''}"
          f"{', API key required' if a.api_key else ''})", file=sys.stderr, flush=True)
    # uvicorn takes SIGTERM for the graceful shutdown, then raises it again with the handler it
    # found: make that one a no-op so a graceful stop exits 0
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    print("overlap-harness serve: stopped", file=sys.stderr, flush=True)
    return 0


def add_commands(sub) -> None:
    from harness.flags import add_engine_flags
    p = sub.add_parser("serve", help="serve the engine over an OpenAI-compatible HTTP API")
    add_engine_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes")
    p.add_argument("--max-body", type=int, default=8 << 20, help="largest request body in bytes (default 8 MiB)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds a client may take to send its request head or the next part of its body")
    p.add_argument("--verbose", action="store_true", help="log every HTTP request")
    p.set_defaults(fn=cmd_serve)
