"""Workloads the races/ suites share, each with the engine settings that make it do what its
name says, and a check that it did."""
from __future__ import annotations

from harness.workloads import presets as workloads
from harness.engine.request import Request
from harness.engine.spec import FIXTURES


def row_reuse(tok, seed=0):
    """A request finishes and its row is rewritten for a new request while its extra step is in flight."""
    return workloads.row_reuse(tok, seed=seed), dict(max_running=3), lambda e: e.sched.n_discarded > 0


def retraction(tok, seed=0):
    """The pool is too small: requests are retracted while a step with them is in flight."""
    return workloads.pressure(tok, seed=seed), dict(max_running=4, pool_slots=120, page_size=2), \
        lambda e: e.sched.n_retracted > 0


def prefix_rewrite(tok, seed=0):
    """Requests with one long prefix arrive together, so several compute it; when their prefill
    results are processed, all but the first rewrite their rows to the cached pages while the
    next step, which reads those rows, is in flight."""
    head = [tok.bos_id] + tok.encode(workloads.SYSTEM * 2)
    reqs = [Request(f"p{i}", head + tok.encode(f"case {i + 7 * seed}"), max_new_tokens=6 + (i + seed) % 5)
            for i in range(6)]
    return reqs, dict(max_running=6, page_size=4), lambda e: e.sched.n_row_rewrites > 0


def _spec(algo, k=3):
    def make(tok, seed=0):
        """Speculative decoding: rows reused while a window is in flight; the oracle drafter's
        full acceptance is the reservation's worst case (the article's Figure 7)."""
        reqs = workloads.row_reuse(tok, n=10, seed=seed)
        for r in reqs:
            r.max_new_tokens += 6
        if algo == "ngram":  # NGRAM waits for every step (no extra step) and rarely guesses a random model
            return reqs, dict(max_running=3, spec=algo, spec_k=k), lambda e: len(e.spec.accept_lens) > 0
        return reqs, dict(max_running=3, spec=algo, spec_k=k, spec_wrong=0.2), \
            lambda e: e.sched.n_discarded > 0 and max(e.spec.accept_lens, default=0) > 1
    return make


SCENARIOS = {"row_reuse": row_reuse, "retraction": retraction, "prefix_rewrite": prefix_rewrite,
             "spec_oracle": _spec("oracle"), "spec_ngram": _spec("ngram")}
if (FIXTURES / "tiny_mtp.pt").exists():
    SCENARIOS["spec_mtp"] = _spec("mtp")


def seeds(oh_options, default: int = 2) -> range:
    return range(oh_options.seeds or default)
