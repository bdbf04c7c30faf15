"""`serve`: the OpenAI-compatible HTTP front end of the reference engine (uvicorn + Starlette).

The server is a front end of the engine, not part of it: one engine thread owns the Engine
(engine_thread.py); HTTP handlers on uvicorn's event loop reach it through a queue.
"""


def __getattr__(name: str):
    # lazy: the CLI imports harness.commands.serve to build its parser, and the HTTP stack takes a second
    if name in ("Server", "make_server"):
        from harness.serve import server
        return getattr(server, name)
    raise AttributeError(name)
