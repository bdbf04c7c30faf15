"""The SGLang agent's device operations on a CUDA GPU (harness.agents.sglang.cpu_ops is the CPU
backend's): delays spin the GPU on the stream whose work they hold back, events are CUDA events."""
from __future__ import annotations


class CudaOps:
    """The few device operations the agent needs (a seam: tests on CPU record them instead)."""

    def __init__(self):
        self._torch = None
        self._side = None
        self._probe = None

    @property
    def torch(self):
        # imported on first use: a plan without delays or device faults needs no device at all
        if self._torch is None:
            import torch
            self._torch = torch
        return self._torch

    def spin(self, ms: float, stream=None) -> None:
        from harness.device.cuda import sleep_cycles_per_ms
        cycles = int(ms * sleep_cycles_per_ms())
        if stream is None:
            self.torch.cuda._sleep(cycles)
        else:
            with self.torch.cuda.stream(stream):
                self.torch.cuda._sleep(cycles)

    def record(self, stream):
        ev = self.torch.cuda.Event()
        ev.record(stream)
        return ev

    def current_stream(self):
        return self.torch.cuda.current_stream()

    def side_stream(self):
        if self._side is None:
            self._side = self.torch.cuda.Stream()
        return self._side

    def stream(self, s):
        return self.torch.cuda.stream(s)

    def keep_alive(self, tensors, stream) -> None:
        for t in tensors:
            if isinstance(t, self.torch.Tensor) and t.is_cuda:
                t.record_stream(stream)

    def blocking_read(self, stream) -> None:
        """A device-to-host copy issued on `stream` into pageable memory: the host waits."""
        if self._probe is None:
            self._probe = self.torch.zeros(1, device="cuda")
        with self.torch.cuda.stream(stream):
            self._probe.cpu()
