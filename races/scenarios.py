"""Workloads the races/ suites share, each with the engine settings that make it do what its
name says, and a check that it did."""
from __future__ import annotations

from harness import workloads
from harness.engine.request import Request


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


SCENARIOS = {"row_reuse": row_reuse, "retraction": retraction, "prefix_rewrite": prefix_rewrite}


def seeds(oh_options, default: int = 2) -> range:
    return range(oh_options.seeds or default)
