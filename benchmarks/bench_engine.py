"""Engine benchmarks (printed, not asserted).

1. Virtual time with the article's Qwen3-8B figures as costs (3.4 ms decode step; CPU
   0.19 ms prepare, 0.37 ms launch, 0.08 ms process), one request as in its Figure 2:
   step period with and without overlap, next to the article's 3.43 ms and 3.87 ms.
2. Wall time: tiny model, batch 8, sim device: decode steps per second (target >= 300/s,
   so stress runs can explore many schedules).
"""
from __future__ import annotations

import time

from harness.device.timeline import step_summary
from harness.engine.build import build_engine
from harness.engine.config import Costs, EngineConfig
from harness.engine.request import Request

QWEN3_8B = Costs(decode_ms=3.4, prepare_ms=0.19, launch_ms=0.37, process_ms=0.08)


def virtual(overlap: bool) -> dict:
    eng, tok = build_engine(EngineConfig(overlap=overlap, costs=QWEN3_8B))
    eng.run([Request("r", [tok.bos_id] + tok.encode("The overlap scheduler"), max_new_tokens=200)])
    return step_summary(eng.dev)


def wall(batch: int = 8, tokens: int = 200, overlap: bool = True) -> tuple[float, int]:
    eng, tok = build_engine(EngineConfig(overlap=overlap, max_running=batch))
    reqs = [Request(f"r{i}", [tok.bos_id] + tok.encode(f"prompt {i}"), max_new_tokens=tokens)
            for i in range(batch)]
    t = time.perf_counter()
    eng.run(reqs)
    dt = time.perf_counter() - t
    return eng.steps / dt, eng.steps


def main() -> None:
    off, on = virtual(False), virtual(True)
    print("virtual time, Qwen3-8B costs, 1 request (ms, medians per step)")
    print(f"{'':24}{'no overlap':>12}{'overlap':>12}{'ratio':>8}")
    print(f"{'step period':24}{off['period_ms']:12.3f}{on['period_ms']:12.3f}{off['period_ms'] / on['period_ms']:8.3f}")
    print(f"{'  article':24}{3.87:12.3f}{3.43:12.3f}{3.87 / 3.43:8.3f}")
    print(f"{'GPU idle gap':24}{off['gpu_idle_gap_ms']:12.3f}{on['gpu_idle_gap_ms']:12.3f}")
    print(f"{'  article':24}{0.28:12.3f}{'~0':>12}")
    print(f"{'host stall':24}{off['host_stall_ms']:12.3f}{on['host_stall_ms']:12.3f}")
    wall(8, 20)  # warm up
    sps_on, n_on = wall(overlap=True)
    sps_off, n_off = wall(overlap=False)
    print("\nwall time, tiny model, batch 8, sim device, serial policy")
    print(f"steps/s overlap on  {sps_on:8.0f}  ({n_on} steps)   target >= 300")
    print(f"steps/s overlap off {sps_off:8.0f}  ({n_off} steps)")


if __name__ == "__main__":
    main()
