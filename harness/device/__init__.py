"""The device layer: one stream API, a simulated and a CUDA implementation."""
from __future__ import annotations

from harness.device.policies import PolicyError, parse_policy


def __getattr__(name: str):
    """Device, Event and Stream on first use: stream imports torch, and the flag checks import
    policies through this package (a process that only reports bad input need not load torch)."""
    if name in ("Device", "Event", "Stream"):
        from harness.device import stream
        return getattr(stream, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DeviceError(RuntimeError):
    pass


def make_device(kind: str, policy: str = "serial", seed: int = 0, launch_overhead: float = 0.0) -> Device:
    if kind == "sim":
        from harness.device.sim import SimDevice
        return SimDevice(parse_policy(policy, seed), launch_overhead=launch_overhead)
    if kind == "cuda":
        from harness.device.cuda import CudaDevice
        return CudaDevice(parse_policy(policy, seed))
    raise DeviceError(f"unknown device {kind!r}: expected sim or cuda")


__all__ = ["Device", "Event", "Stream", "make_device", "parse_policy", "PolicyError", "DeviceError"]
