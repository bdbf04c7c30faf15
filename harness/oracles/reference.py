"""Do a run's tokens match the absolute reference: each request alone, overlap off, serial?

The absolute reference (issue 10, item 2): each request run alone, overlap off, serial.

Comparing overlap on with overlap off of the same engine misses a bug that corrupts both
alike (a slip that depends on which requests share a batch, say). A batch-invariant engine
gives a request the same tokens whatever else is in its batch, so the request run alone is an
exact reference for its tokens in any batch. "Alone" is `max_running=1` on the target's own
engine (its faults included: a user's engine has no fault-free twin), so one run per workload
serves every request; the result is cached per workload and engine switches, so suites that
share a workload pay once.
"""
from __future__ import annotations

import json

ABSOLUTE = "the absolute reference (each request alone, overlap off)"
RELATIVE = "the overlap-off run"
_CACHE: dict[str, object] = {}
_CACHE_MAX = 64


def batch_invariant(target) -> bool:
    """Whether the target's tokens may be compared exactly. The ref target says so only where
    its start-up probe verified its kernels (harness.engine.invariance); a real engine only when
    it runs batch-invariant kernels. Otherwise a divergence is judged tie or race."""
    return bool(getattr(target, "batch_invariant", False))


INEXACT = ("batch invariance not verified for this target: divergences are judged as for a real engine "
           "(a numerical tie is rounding, reported; only a clear winner fails)")


def _key(target, reqs, kw) -> str:
    from harness.workloads.presets import clone
    reqs = [{k: v for k, v in vars(r).items()} for r in clone(reqs)]  # the workload, no run state
    return json.dumps([getattr(target, "name", "?"), sorted(getattr(target, "faults", ())),
                       getattr(target, "model", None), repr(sorted(getattr(target, "engine_kw", {}).items())),
                       reqs, sorted((k, repr(v)) for k, v in kw.items())],
                      default=repr)


def solo_switches(kw: dict) -> dict:
    """The engine switches of the reference run: the workload's, one request at a time."""
    return {**{k: v for k, v in kw.items() if k not in ("overlap", "policy")}, "max_running": 1}


def absolute_reference(target, reqs, **kw):
    """The target's Run of `reqs` one request at a time with overlap off under the serial
    policy, or None when the target is not batch-invariant (the reference would not be exact)."""
    if not batch_invariant(target):
        return None
    key = _key(target, reqs, kw)
    run = _CACHE.get(key)
    if run is None:
        run = target.run(reqs, overlap=False, policy="serial", **solo_switches(kw))
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = run
    return run


def divergences(off, on, ref=None, tol=None) -> list[tuple[str, str, list]]:
    """Every comparison that found a divergence, as (reference, run under test, divergences):
    overlap on against the overlap-off run, then overlap on and overlap off against the
    absolute reference `ref` (when there is one). Runs are targets' Runs."""
    from harness.oracles.divergence import DEFAULT_TIE_TOL, compare_runs
    tol = DEFAULT_TIE_TOL if tol is None else tol
    out = []
    d = compare_runs(off, on, tol)
    if d:
        out.append((RELATIVE, "overlap on", d))
    if ref is not None:
        for label, run in (("overlap on", on), ("overlap off", off)):
            d = compare_runs(ref, run, tol, labels=("alone", label))
            if d:
                out.append((ABSOLUTE, label, d))
    return out


def unjudged(target, reqs) -> tuple[set, str]:
    """The requests whose tokens this target cannot compare across the arms, and why: a target
    that cannot seed its sampling (SglangTarget.unseeded_sampling) samples each arm afresh. Their
    records are still judged (a logprob record must be its own token's); their tokens are not."""
    why = getattr(target, "unseeded_sampling", "") or ""
    if not why:
        return set(), ""
    return {r.rid for r in reqs if float(getattr(r, "temperature", 0.0) or 0.0) > 0.0}, why


def without(found, rids) -> list[tuple[str, str, list]]:
    """`divergences`' result less the divergences of `rids` (n > 1 samples "rid#i" included)."""
    out = []
    for ref, under, divs in found:
        keep = [d for d in divs if d.rid.split("#")[0] not in rids]
        if keep:
            out.append((ref, under, keep))
    return out


class NothingToJudge(Exception):
    """Every request of one workload is sampled on a target that cannot compare sampled tokens."""


def not_exercised(target, reqs, record_property=None, where: str = "", skip: bool = True) -> set:
    """unjudged() for a case: skips it as "not exercised: why" when no request is left to judge
    (`skip=False`: raises NothingToJudge instead, for one example of many), else records how many
    were left out (the gate lists it) and returns their ids."""
    from harness.verdict import outcome
    rids, why = unjudged(target, reqs)
    if rids and len(rids) == len({r.rid for r in reqs}):
        if not skip:
            raise NothingToJudge(why)
        outcome.not_exercised(f"not exercised: every request {where or 'here'} is sampled: {why}", "sampled_only",
                              skip=True)
    if rids and record_property is not None:
        record_property("not_exercised", f"sampled requests are left out of the token comparison on "
                                         f"{getattr(target, 'name', 'the target')}: {why}")
    return rids
