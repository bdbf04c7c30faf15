"""Token-for-token comparison of two runs of one workload, and what a divergence looks like.

For each request whose tokens differ between a reference run (overlap off) and a run under
test (overlap on), a `Divergence` gives the first divergent position, both continuations
from there, and whether the two tokens were a numerical tie at that position: the gap
between their log-probabilities (or, failing that, between the top two) within `tol` in
either run. A batch-invariant target (the ref engine) must give identical tokens, so any
divergence is a bug; on a real engine a divergence that begins at a near-tie is most likely
rounding (a different kernel, a different batch), one that begins at a clear winner is not.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

DEFAULT_TIE_TOL = 1e-2  # nats: below bf16's resolution of a logit, above float32 reduction noise
CONTEXT = 8  # tokens of each continuation shown in a report


@dataclass
class Divergence:
    rid: str
    position: int  # index into the output tokens of the first difference
    expected: list[int]  # reference continuation from `position` (overlap off)
    got: list[int]  # continuation under test from `position` (overlap on)
    expected_finish: str | None = None
    got_finish: str | None = None
    top2_expected: list = field(default_factory=list)  # [(token, logprob), (token, logprob)] there, if known
    top2_got: list = field(default_factory=list)
    gap: float | None = None  # logprob gap between the two diverging tokens (smallest over both runs)
    near_tie: bool | None = None  # None: no log-probabilities to decide from

    @property
    def verdict(self) -> str:
        if self.near_tie is None:
            return "undecided (no log-probabilities for both tokens there)"
        return "numerical tie (likely rounding)" if self.near_tie else "clear winner (not rounding: a race or a bug)"

    def describe(self, detok=None, context: int = CONTEXT) -> str:
        def show(ids):
            s = str(ids[:context]) + (" ..." if len(ids) > context else "")
            if detok is not None:
                s += f" {detok(ids[:context])!r}"
            return s
        gap = f", logprob gap {self.gap:.3g}" if self.gap is not None else ""
        lines = [f"request {self.rid}: first divergent token at position {self.position}: {self.verdict}{gap}",
                 f"  overlap off: {show(self.expected)} (finish {self.expected_finish})",
                 f"  overlap on:  {show(self.got)} (finish {self.got_finish})"]
        if self.top2_expected or self.top2_got:
            lines.append(f"  top-2 there: off {_fmt_top(self.top2_expected)}; on {_fmt_top(self.top2_got)}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return asdict(self)


def _fmt_top(top) -> str:
    return "[" + ", ".join(f"{t}: {lp:.4f}" for t, lp in top) + "]" if top else "n/a"


def _lp_of(entry, token: int, own: int) -> float | None:
    """The logprob of `token` at one position: entry = (logprob of the run's own token `own`,
    [(token, logprob)] top-K)."""
    if token == own:
        return float(entry[0])
    for t, lp in entry[1]:
        if int(t) == token:
            return float(lp)
    return None


def _gap(entry, own: int, other: int) -> float | None:
    """Logprob gap at one position between the run's own token and the other run's. A token
    outside the top-K list has at most the K-th logprob, so the gap is then a lower bound when
    the own token is above it, and unknown otherwise."""
    if entry is None:
        return None
    la, lb = _lp_of(entry, own, own), _lp_of(entry, other, own)
    if lb is not None:
        return abs(la - lb)
    top = entry[1]
    if not top:
        return None
    kth = min(float(lp) for _, lp in top)
    return la - kth if la > kth else None


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(expected, got, expected_lp: dict | None = None, got_lp: dict | None = None,
            tol: float = DEFAULT_TIE_TOL) -> list[Divergence]:
    """Divergences between two lists of outputs (rid, token ids, finish reason), matched by rid.

    `*_lp` map rid -> per-token (chosen logprob, [(token, logprob)] top-K) (Request.output_logprobs)."""
    got_by = {o[0]: o for o in got}
    out = []
    for rid, ids, fin in expected:
        g = got_by.get(rid)
        g_ids, g_fin = (g[1], g[2]) if g is not None else ([], "missing")
        k = first_difference(list(ids), list(g_ids))
        if k is None and fin == g_fin:
            continue
        if k is None:  # same tokens, different finish reason
            k = len(ids)
        d = Divergence(rid, k, list(ids[k:]), list(g_ids[k:]), fin, g_fin)
        el = (expected_lp or {}).get(rid) or []
        gl = (got_lp or {}).get(rid) or []
        e_at = el[k] if k < len(el) else None
        g_at = gl[k] if k < len(gl) else None
        d.top2_expected = [(int(t), float(v)) for t, v in e_at[1][:2]] if e_at else []
        d.top2_got = [(int(t), float(v)) for t, v in g_at[1][:2]] if g_at else []
        if k < len(ids) and k < len(g_ids):
            a, b = ids[k], g_ids[k]
            gaps = [x for x in (_gap(e_at, a, b), _gap(g_at, b, a)) if x is not None]
            if gaps:
                d.gap = min(gaps)
                d.near_tie = d.gap <= tol
        out.append(d)
    return out


def run_logprobs(run) -> dict | None:
    """rid -> output_logprobs of a target's Run, when the target exposes them.

    A Run may carry `logprobs` (rid -> list) itself; for the ref target the finished requests
    are read from its engine's scheduler."""
    lp = getattr(run, "logprobs", None)
    if lp:
        return dict(lp)
    eng = getattr(run, "engine", None)
    sched = getattr(eng, "sched", None)
    if sched is None:
        return None
    return {r.rid: list(r.output_logprobs) for r in getattr(sched, "finished", [])}


def compare_runs(off, on, tol: float = DEFAULT_TIE_TOL) -> list[Divergence]:
    """Divergences of `on` (overlap on) from `off` (overlap off), two targets' Runs."""
    return compare(off.outputs, on.outputs, run_logprobs(off), run_logprobs(on), tol)


def report(divs: list[Divergence], detok=None, limit: int = 5) -> str:
    if not divs:
        return "no divergence"
    ties = sum(1 for d in divs if d.near_tie)
    head = (f"{len(divs)} request(s) diverge with overlap on ({ties} at a numerical tie, "
            f"{sum(1 for d in divs if d.near_tie is False)} at a clear winner)")
    body = [d.describe(detok) for d in divs[:limit]]
    more = [f"... and {len(divs) - limit} more"] if len(divs) > limit else []
    return "\n".join([head] + body + more)
