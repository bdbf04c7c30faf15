"""Are the accept lengths right: equal overlap on and off, in the oracle drafter's band?

The speculative acceptance oracle (issue 10, item 7).

A bug can keep every token right and still waste drafts (a verify that drops a match, a
drafter fed stale state under overlap): only the accept lengths show it. Two checks:

- per request, the accept lengths with overlap on equal those with overlap off, step for step
  (the drafters are deterministic and the engine batch-invariant, so overlap may not change them);
- the oracle drafter replaces each draft token by a wrong one with probability p, independently
  per position, so a window accepts j draft tokens (j < k) with probability (1-p)^j p and all k
  with (1-p)^k: the mean accept length (bonus token included) of n windows must lie within
  z standard errors of that distribution's mean, z set for a false alarm rate of FALSE_ALARM.
"""
from __future__ import annotations

import math
from statistics import NormalDist

FALSE_ALARM = 1e-6  # two-sided, per check: `check --seeds 200` runs a few hundred of them
MIN_WINDOWS = 30  # fewer give no band worth judging


def oracle_distribution(k: int, p: float) -> list[float]:
    """P(accept length = 1 + j) for j = 0..k (j draft tokens accepted, then the bonus token)."""
    q = 1.0 - p
    return [q ** j * p for j in range(k)] + [q ** k]


def band(k: int, p: float, n: int, false_alarm: float = FALSE_ALARM) -> tuple[float, float, float]:
    """(low, expected mean, high) of the mean accept length over n windows."""
    dist = oracle_distribution(k, p)
    mean = sum((1 + j) * w for j, w in enumerate(dist))
    var = sum((1 + j - mean) ** 2 * w for j, w in enumerate(dist))
    z = NormalDist().inv_cdf(1 - false_alarm / 2)
    half = z * math.sqrt(var / max(n, 1))
    return mean - half, mean, mean + half


def per_request_problems(on: dict, off: dict, limit: int = 3) -> list[str]:
    """Requests whose accept lengths differ between overlap on and off (rid -> lengths)."""
    out = []
    for rid in sorted(set(on) | set(off)):
        a, b = off.get(rid, []), on.get(rid, [])
        if a != b:
            k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            out.append(f"request {rid}: accept lengths differ from window {k}: overlap off {a[k:k + 6]}, "
                       f"overlap on {b[k:k + 6]}")
            if len(out) >= limit:
                break
    return out


def band_problem(lengths: list[int], k: int, p: float) -> str | None:
    """Why the oracle drafter's accept lengths do not fit its wrong-token probability, or None."""
    n = len(lengths)
    if n < MIN_WINDOWS:
        return None
    lo, mean, hi = band(k, p, n)
    got = sum(lengths) / n
    if lo <= got <= hi:
        return None
    return (f"the oracle drafter's mean accept length is {got:.3f} over {n} windows, outside "
            f"[{lo:.3f}, {hi:.3f}] (expected {mean:.3f} for k={k}, wrong-token probability {p}): "
            f"drafts are {'wasted' if got < lo else 'accepted that should not be'}")
