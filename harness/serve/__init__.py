"""`serve`: the OpenAI-compatible HTTP front end of the reference engine (uvicorn + FastAPI).

The server is a front end of the engine, not part of it: one engine thread owns the Engine
(engine_thread.py); HTTP handlers on uvicorn's event loop reach it through a queue.
"""
from harness.serve.server import Server, make_server  # noqa: F401
