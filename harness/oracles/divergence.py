"""Where do two runs of one workload first differ, and was it a near-tie or a race?

Token-for-token comparison of two runs of one workload, and what a divergence looks like.

For each request whose tokens differ between a reference run (overlap off) and a run under
test (overlap on), a `Divergence` gives the first divergent position, both continuations
from there, and whether the two tokens were a numerical tie at that position: the gap
between their log-probabilities (or, failing that, between the top two) within `tol` in
either run. A batch-invariant target (the ref engine) must give identical tokens, so any
divergence is a bug; on a real engine a divergence that begins at a near-tie is most likely
rounding (a different kernel, a different batch), one that begins at a clear winner is not.

The tie verdict is taken only from log-probability records that provably belong to the
returned tokens (`inconsistency`): a record whose chosen token is not the token returned at
that position (a stale host buffer, a record of another step) says nothing about a tie, and is
itself evidence of a race, so such a divergence is classified as a race.

A record is either the ref engine's (chosen logprob, [(token, logprob)] top-K), optionally
with the chosen token id as a third element, or a real engine's {token id: logprob} over the
top-k alternatives plus the chosen token (an OpenAI-compatible server's `top_logprobs`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

DEFAULT_TIE_TOL = 1e-2  # nats: below bf16's resolution of a logit, above float32 reduction noise
RECORD_TOL = 1e-5  # nats: a record's chosen logprob and its top list come from one tensor: they agree
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
    inconsistent: str | None = None  # a record there does not belong to its returned token: a race
    labels: tuple = ("overlap off", "overlap on")  # (reference, run under test)

    @property
    def verdict(self) -> str:
        if self.inconsistent:
            return f"race (the logprob record is not the returned token's: {self.inconsistent})"
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
        a, b = self.labels
        w = max(len(a), len(b)) + 1
        lines = [f"request {self.rid}: first divergent token at position {self.position}: {self.verdict}{gap}",
                 f"  {(a + ':').ljust(w)} {show(self.expected)} (finish {self.expected_finish})",
                 f"  {(b + ':').ljust(w)} {show(self.got)} (finish {self.got_finish})"]
        if self.top2_expected or self.top2_got:
            lines.append(f"  top-2 there: {a} {_fmt_top(self.top2_expected)}; {b} {_fmt_top(self.top2_got)}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return asdict(self)


def _fmt_top(top) -> str:
    return "[" + ", ".join(f"{t}: {lp:.4f}" for t, lp in top) + "]" if top else "n/a"


def normalize(entry, own: int):
    """(chosen logprob, [(token, logprob)] top list, the record's own token id or None) from
    either record shape; the chosen logprob is the returned token `own`'s as the record says."""
    if isinstance(entry, dict):  # {token id: logprob}: top-k plus the chosen token
        top = sorted(((int(t), float(v)) for t, v in entry.items()), key=lambda x: -x[1])
        chosen = dict(top).get(int(own))
        return chosen, top, (int(own) if chosen is not None else None)
    lp, top = float(entry[0]), [(int(t), float(v)) for t, v in entry[1]]
    return lp, top, (int(entry[2]) if len(entry) > 2 and entry[2] is not None else None)


def inconsistency(entry, token: int, tol: float = RECORD_TOL) -> str | None:
    """Why a logprob record cannot be the record of `token` (the token returned at its
    position), or None when it can. A record from another position or step is the typical
    cause: a host buffer read before, or after, the copy that belongs to this token."""
    if entry is None:
        return None
    token = int(token)
    if isinstance(entry, dict):
        if not entry:
            return None
        if not any(int(t) == token for t in entry):
            return f"it lists no logprob for the returned token {token} (its tokens: {sorted(int(t) for t in entry)[:6]})"
        return None
    lp, top, tid = normalize(entry, token)
    if tid is not None and tid != token:
        return f"it was recorded for token {tid}, but token {token} was returned"
    if not top:
        return None
    at = dict(top).get(token)
    if at is not None and abs(at - lp) > tol:
        return f"its chosen logprob {lp:.4f} is not the returned token {token}'s ({at:.4f} in its top list)"
    best, kth = top[0][1], min(v for _, v in top)
    if lp > max(best, *(v for _, v in top)) + tol:
        return f"its chosen logprob {lp:.4f} is above its own top-1 ({best:.4f})"
    if at is None and lp > kth + tol:
        return (f"the returned token {token} is missing from its top list although its chosen logprob {lp:.4f} "
                f"is above the list's last ({kth:.4f})")
    return None


def record_problems(outputs, logprobs: dict | None, limit: int = 5) -> list[str]:
    """Records of a run that do not belong to their returned tokens: (rid, position, why) lines,
    the first per request. `outputs`: (rid, token ids, finish); `logprobs`: rid -> records."""
    out = []
    for rid, ids, _ in outputs:
        recs = (logprobs or {}).get(rid) or []
        for k, (tok, rec) in enumerate(zip(ids, recs)):
            why = inconsistency(rec, tok)
            if why:
                out.append(f"request {rid}, token {k}: the logprob record {why}")
                break
        if len(out) >= limit:
            break
    return out


def _lp_of(entry, token: int, own: int) -> float | None:
    """The logprob of `token` at one position, from a record of the run's own token `own`."""
    chosen, top, _ = normalize(entry, own)
    if token == own and chosen is not None:
        return float(chosen)
    for t, lp in top:
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
    if la is None:
        return None
    if lb is not None:
        return abs(la - lb)
    top = normalize(entry, own)[1]
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
            tol: float = DEFAULT_TIE_TOL, labels: tuple = ("overlap off", "overlap on")) -> list[Divergence]:
    """Divergences between two lists of outputs (rid, token ids, finish reason), matched by rid.

    `*_lp` map rid -> per-token records (Request.output_logprobs, or {token: logprob} dicts);
    `labels` name the two runs in reports (reference, run under test)."""
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
        d = Divergence(rid, k, list(ids[k:]), list(g_ids[k:]), fin, g_fin, labels=tuple(labels))
        el = (expected_lp or {}).get(rid) or []
        gl = (got_lp or {}).get(rid) or []
        e_at = el[k] if k < len(el) else None
        g_at = gl[k] if k < len(gl) else None
        if k < len(ids) and k < len(g_ids):
            a, b = ids[k], g_ids[k]
            d.top2_expected = normalize(e_at, a)[1][:2] if e_at else []
            d.top2_got = normalize(g_at, b)[1][:2] if g_at else []
            # only records that belong to the returned tokens decide a tie; one that does not is a race
            bad = [f"{lab}: {why}" for lab, why in ((labels[0], inconsistency(e_at, a)), (labels[1], inconsistency(g_at, b)))
                   if why]
            if bad:
                d.inconsistent, d.near_tie = "; ".join(bad), False
            else:
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


def compare_runs(off, on, tol: float = DEFAULT_TIE_TOL, labels: tuple = ("overlap off", "overlap on")
                 ) -> list[Divergence]:
    """Divergences of `on` (overlap on) from `off` (overlap off), two targets' Runs."""
    return compare(off.outputs, on.outputs, run_logprobs(off), run_logprobs(on), tol, labels)


def report(divs: list[Divergence], detok=None, limit: int = 5) -> str:
    if not divs:
        return "no divergence"
    ties = sum(1 for d in divs if d.near_tie)
    races = sum(1 for d in divs if d.inconsistent)
    ref, under = divs[0].labels
    head = (f"{len(divs)} request(s) diverge with {under} from {ref} ({ties} at a numerical tie, "
            f"{sum(1 for d in divs if d.near_tie is False and not d.inconsistent)} at a clear winner"
            + (f", {races} with a logprob record that is not the returned token's" if races else "") + ")")
    body = [d.describe(detok) for d in divs[:limit]]
    more = [f"... and {len(divs) - limit} more"] if len(divs) > limit else []
    return "\n".join([head] + body + more)
