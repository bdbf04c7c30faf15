"""Decode throughput of our engine against transformers on SmolLM2-135M-Instruct (CPU).

    python benchmarks/bench_smollm2.py [--new-tokens 32] [--threads 1] [--max-context 512]

Both sides run the same 8 chat-templated prompts, greedy, ignoring EOS so every
request makes exactly --new-tokens tokens:
  ours:         Engine on the simulated device, serial policy, overlap on, 8 requests at once;
  transformers: LlamaForCausalLM.generate, batch 8, left padding, KV cache on.
The two share one copy of the float32 weights.

Decode tokens/s excludes prefill by difference: each side is timed making 1 token
(prefill + first token) and N tokens; decode tok/s = 8 * (N - 1) / (t_N - t_1). Each
timing is the best of --repeats runs (the machine may be shared), and the same ratio
is also given on process CPU time, which a busy shared machine disturbs less. Peak RSS is the
process's ru_maxrss at the end (it includes the one-off GGUF conversion when the
cache was cold; rerun then).
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.device import make_device  # noqa: E402
from harness.engine.config import EngineConfig  # noqa: E402
from harness.engine.loop import Engine  # noqa: E402
from harness.engine.model import Model  # noqa: E402
from harness.engine.request import Request  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "Give me a synonym for happy.",
    "What is 12 times 12?",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish.",
]


def peak_rss_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024 if sys.platform != "darwin" else r / (1 << 20)  # KiB on Linux, bytes on macOS


def best(make, repeats: int):
    """Run make()() `repeats` times; the best wall and CPU seconds (separately) and the last output.
    make() builds untimed state and returns the function to time."""
    out, wall, cpu = None, float("inf"), float("inf")
    for _ in range(repeats):
        go = make()
        w0, c0 = time.perf_counter(), time.process_time()
        out = go()
        wall, cpu = min(wall, time.perf_counter() - w0), min(cpu, time.process_time() - c0)
    return wall, cpu, out


def ours(cfg, weights, prompts, new_tokens, max_context):
    ecfg = EngineConfig(model="smollm2", overlap=True, policy="serial", max_running=len(prompts),
                        pool_slots=len(prompts) * max_context + 1, max_context=max_context)
    c = ecfg.costs
    dev = make_device("sim", "serial", 0, c.launch_ms / c.launches_per_step)
    model = Model(cfg, weights, dev.torch_device)  # float32 contiguous already: no copy

    def run(n):
        # a fresh engine per run (tables, KV pool, prefix cache); built outside the timed part
        eng = Engine(ecfg, cfg, model, dev)
        reqs = [Request(f"r{i}", p, max_new_tokens=n, ignore_eos=True) for i, p in enumerate(prompts)]

        def go():
            with torch.no_grad():
                eng.run(reqs)
            return [r.output_ids for r in reqs]
        return go

    return lambda n, repeats: best(lambda: run(n), repeats)


def theirs(ref, tok, texts, pad_id):
    enc = tok.tok(texts, padding=True, padding_side="left", add_special_tokens=False, return_tensors="pt")

    def go(n):
        # eos_token_id=None as an argument ignores EOS (a generation_config with it unset does not:
        # the model's default fills it in); no min length either, which would mask EOS logits
        with torch.no_grad():
            out = ref.generate(**enc, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=pad_id)
        return out[:, enc["input_ids"].shape[1]:].tolist()
    return lambda n, repeats: best(lambda: (lambda: go(n)), repeats)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads for both sides (default 1: fastest on a small shared box)")
    ap.add_argument("--max-context", type=int, default=256,
                    help="row width of our engine's slot table; default: the engine's")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from harness.engine.smollm2 import ModelUnavailable, hf_model, load_smollm2
    t0 = time.perf_counter()
    try:
        cfg, weights, tok = load_smollm2(max_context=a.max_context)
    except ModelUnavailable as e:
        print(f"bench_smollm2: {e}", file=sys.stderr)
        return 2
    ref = hf_model(weights=weights)  # same tensors
    load_s = time.perf_counter() - t0

    texts = [tok.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    prompts = [tok.encode(t) for t in texts]
    N = a.new_tokens
    B = len(prompts)

    rows = []
    results = {}
    for name, timed in (("ours", ours(cfg, weights, prompts, N, a.max_context)),
                        ("transformers", theirs(ref, tok, texts, cfg.pad_id))):
        timed(2, 1)  # warm-up
        t1, c1, _ = timed(1, a.repeats)
        tn, cn, out = timed(N, a.repeats)
        assert all(len(o) == N for o in out), f"{name}: expected {N} tokens per request"
        results[name] = out
        rows.append((name, t1, tn, B * N / tn, B * (N - 1) / (tn - t1), B * (N - 1) / (cn - c1)))

    same = sum(x == y for x, y in zip(results["ours"], results["transformers"]))
    prefix = [next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), N)
              for x, y in zip(results["ours"], results["transformers"])]

    lens = sorted(len(p) for p in prompts)
    print(f"SmolLM2-135M-Instruct float32, CPU, torch {torch.__version__}, {a.threads} thread(s); "
          f"{B} prompts of {lens[0]}-{lens[-1]} tokens, greedy, {N} new tokens each, EOS ignored")
    print(f"ours: sim device, serial policy, overlap on, max_context {a.max_context}; "
          f"transformers: generate, batch {B}, left padding; model load {load_s:.1f} s")
    print(f"decode tok/s = {B} x ({N} - 1) / (t[{N} tokens] - t[1 token]), best of {a.repeats}\n")
    print(f"{'engine':<14}{'t 1 tok (s)':>12}{f't {N} tok (s)':>13}{'e2e tok/s':>11}{'decode tok/s':>14}"
          f"{'decode tok/CPU-s':>18}")
    for name, t1, tn, e2e, dec, dec_cpu in rows:
        print(f"{name:<14}{t1:>12.2f}{tn:>13.2f}{e2e:>11.1f}{dec:>14.1f}{dec_cpu:>18.1f}")
    ratio, ratio_cpu = rows[0][4] / rows[1][4], rows[0][5] / rows[1][5]
    rss = peak_rss_mb()
    print(f"\ndecode ratio ours/transformers: {ratio:.2f}x wall, {ratio_cpu:.2f}x CPU time (target >= 1.0x) "
          f"{'OK' if ratio >= 1.0 else 'BELOW TARGET'}")
    print(f"peak RSS: {rss:.0f} MiB (target <= 1536 MiB) {'OK' if rss <= 1536 else 'ABOVE TARGET'}")
    print(f"greedy outputs identical: {same}/{B} prompts; first divergence at token "
          f"{', '.join(map(str, prefix))} (of {N}; batched left-padded fp32 may flip near-ties)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
