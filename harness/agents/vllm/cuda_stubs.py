"""torch.cuda's streams and events as no-op stubs, around the few calls where a vLLM release
reaches for them on CPU without a driver (they raise there). Installed by the release table's
facts (install.register): only where the release has the async output path and does not stub
them itself (vLLM does from 0.23), and only when no CUDA device is there.
"""
from __future__ import annotations

from harness.agents.vllm import state


class _StreamStub:
    """torch.cuda's stream where a release calls it on CPU without a driver: waits and entering
    are no-ops (CPU work is ordered by the host)."""
    device = None

    def __init__(self, *a, **kw):
        pass

    def wait_stream(self, *a, **kw):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _EventStub:
    def __init__(self, *a, **kw):
        pass

    def record(self, *a, **kw):
        pass

    def synchronize(self):
        pass

    def query(self) -> bool:
        return True


class CudaStubs:
    """While the async output's __init__ runs: torch.cuda.current_stream / stream / Event and
    torch.Event as stubs (what vLLM does itself from 0.23), and the CPU model runner's stream
    placeholder given a wait_stream (it has none before 0.25). Only where the release needs it
    and no CUDA device is there."""

    NAMES = (("cuda", "current_stream"), ("cuda", "stream"), ("cuda", "Event"), (None, "Event"))
    # the model runner's __init__ where it records its input event on the default stream (the
    # CPU runner's own event placeholder there takes no stream)
    RUNNER = (("cuda", "default_stream"), ("cuda", "Event"))

    def __init__(self, args, names=NAMES):
        import torch
        self.torch, self.args, self.names, self.saved = torch, args, names, []

    def __enter__(self):
        t = self.torch
        stubs = {"current_stream": lambda *a, **kw: _StreamStub(), "stream": lambda *a, **kw: _StreamStub(),
                 "default_stream": lambda *a, **kw: _StreamStub(), "Event": _EventStub}
        for mod, name in self.names:
            owner = t.cuda if mod else t
            self.saved.append((owner, name, owner.__dict__.get(name, getattr(owner, name, None))))
            setattr(owner, name, stubs[name])
        for a in self.args:  # the copy stream: the CPU runner's placeholder
            if type(a).__name__ == "_StreamPlaceholder" and not hasattr(a, "wait_stream"):
                a.wait_stream = lambda *x, **kw: None
        return self

    def __exit__(self, *exc):
        for owner, name, orig in reversed(self.saved):
            setattr(owner, name, orig)
        return False


STUB_CUDA = {"on": False, "runner": False}  # set by install.register() from the release table


def cuda_stubs(on: bool, args, names=CudaStubs.NAMES):
    """The stubs around one call where the release needs them (the worker's facts say so), else nothing."""
    if not on:
        import contextlib
        return contextlib.nullcontext()
    state.facts("worker").set(cuda_stubbed=True)
    return CudaStubs(args, names)


def needs_cuda_stubs(v: str | None) -> bool:
    """The release fact that turns the stubs on: async output path, no stubs of vLLM's own, no device."""
    from harness.targets.vllm.releases import TORCH, release
    if v is None or v not in TORCH:
        return False
    r = release(v)
    if not r.has("async_output") or r.has("vllm_stubs_cuda"):
        return False
    import torch
    return not torch.cuda.is_available()
