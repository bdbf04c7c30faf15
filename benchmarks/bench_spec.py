"""Speculative decoding in virtual time (printed, not asserted).

1. The article's GLM-5.3 MTP figures as costs (an 8.2 ms step: two 0.2 ms draft passes,
   a 7.4 ms verify pass, 0.4 ms draft extend; 1.8 ms of CPU per step), one request:
   the gap between steps and the step period with and without overlap, next to the
   article's 0.3 -> 0.01 ms and 9.0 -> 8.3 ms.
2. NGRAM's idle gap per step at 1, 8 and 32 requests (the host waits for each step, then
   looks up each request's drafts), next to the article's 0.30, 0.54 and 1.34 ms on Qwen3-8B.
"""
from __future__ import annotations

from harness.device.timeline import step_summary
from harness.engine.build import build_engine
from harness.engine.config import Costs, EngineConfig
from harness.engine.request import Request
from harness.engine.spec import FIXTURES

GLM_MTP = Costs(verify_ms=7.4, draft_ms=0.2, extend_ms=0.4, prepare_ms=0.3, launch_ms=1.2, process_ms=0.3,
                launches_per_step=12, prefill_ms_per_token=0.05)
QWEN_NGRAM = Costs(verify_ms=4.4, prepare_ms=0.19, launch_ms=0.37, process_ms=0.08, ngram_lookup_ms=0.03)


def run(costs, overlap, algo, n=1, tokens=120):
    drafter = algo
    eng, tok = build_engine(EngineConfig(overlap=overlap, costs=costs, spec=drafter, spec_k=3, max_running=max(n, 4),
                                         pool_slots=16384))
    reqs = [Request(f"r{i}", [tok.bos_id] + tok.encode(f"prompt number {i}"), max_new_tokens=tokens)
            for i in range(n)]
    eng.run(reqs)
    s = step_summary(eng.dev)
    s["accept"] = sum(eng.spec.accept_lens) / len(eng.spec.accept_lens)
    return s


def main():
    algo = "mtp" if (FIXTURES / "tiny_mtp.pt").exists() else "oracle"
    off, on = run(GLM_MTP, False, algo), run(GLM_MTP, True, algo)
    print(f"virtual time, GLM-5.3 MTP costs, 1 request, drafter {algo} (ms, medians per step)")
    print(f"{'':22}{'no overlap':>12}{'overlap':>10}{'article off':>13}{'article on':>12}")
    print(f"{'gap between steps':22}{off['gpu_idle_gap_ms']:12.3f}{on['gpu_idle_gap_ms']:10.3f}{0.3:13.2f}{0.01:12.2f}")
    print(f"{'step period':22}{off['period_ms']:12.3f}{on['period_ms']:10.3f}{9.0:13.2f}{8.3:12.2f}")
    print(f"{'period ratio off/on':22}{off['period_ms'] / on['period_ms']:12.3f}{'':10}{9.0 / 8.3:13.3f}")
    print(f"{'mean accept length':22}{off['accept']:12.2f}{on['accept']:10.2f}{2.8:13.2f}{2.8:12.2f}")
    print("\nNGRAM, Qwen3-8B-like costs, overlap on: GPU idle gap per step (ms)")
    print(f"{'requests':>10}{'gap':>10}{'article':>10}{'period':>10}")
    for n, art in [(1, 0.30), (8, 0.54), (32, 1.34)]:
        s = run(QWEN_NGRAM, True, "ngram", n=n, tokens=60)
        print(f"{n:>10}{s['gpu_idle_gap_ms']:10.3f}{art:10.2f}{s['period_ms']:10.3f}")


if __name__ == "__main__":
    main()
