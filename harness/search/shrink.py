"""Shrinking: delta debugging on the case hypothesis left, keeping every step that still
fails the same way."""
from __future__ import annotations

import time

from harness.engine.request import Request
from harness.workloads.strategies import Case


def _simpler_requests(r: Request):
    """Variants of one request, each a step toward the plain greedy request."""
    from harness.workloads.presets import clone
    def v(**kw):
        c = clone([r])[0]
        for k, x in kw.items():
            setattr(c, k, x)
        return c
    if r.arrival:
        yield v(arrival=0)
    if r.abort_after is not None:
        yield v(abort_after=None)
    if r.stop:
        yield v(stop=())
    if r.temperature:
        yield v(temperature=0.0, top_p=1.0, seed=None)
    if r.repetition_penalty != 1.0:
        yield v(repetition_penalty=1.0)
    if r.max_new_tokens > 1:
        yield v(max_new_tokens=max(1, r.max_new_tokens // 2))
        yield v(max_new_tokens=r.max_new_tokens - 1)
    keep = 1  # the first token stays (the BOS, for models that have one)
    if len(r.prompt_ids) > keep + 1:
        n = len(r.prompt_ids) - keep
        yield v(prompt_ids=r.prompt_ids[:keep] + r.prompt_ids[keep + n // 2:])
        yield v(prompt_ids=r.prompt_ids[:keep] + r.prompt_ids[keep:keep + n // 2] or r.prompt_ids[:keep + 1])


def greedy_shrink(case: Case, still_fails, deadline: float) -> Case:
    """Delta debugging on what hypothesis left: drop requests, then simplify the policy, the
    engine switches and each request, keeping every step that still fails the same way."""
    def attempt(c: Case) -> bool:
        if time.monotonic() > deadline:
            raise StopSearch()
        return still_fails(c)
    try:
        changed = True
        while changed:
            changed = False
            for i in range(len(case.requests)):
                if len(case.requests) > 1 and i < len(case.requests):
                    c = Case(dict(case.engine), case.policy, case.requests[:i] + case.requests[i + 1:])
                    if attempt(c):
                        case, changed = c, True
            if case.policy != "serial" and attempt(Case(dict(case.engine), "serial", case.requests)):
                case, changed = Case(dict(case.engine), "serial", case.requests), True
            for k in [k for k in case.engine if k not in ("max_running", "model", "costs")]:
                eng = {x: y for x, y in case.engine.items() if x != k}
                if attempt(Case(eng, case.policy, case.requests)):
                    case, changed = Case(eng, case.policy, case.requests), True
            for i in range(len(case.requests)):
                for r in _simpler_requests(case.requests[i]):
                    c = Case(dict(case.engine), case.policy, case.requests[:i] + [r] + case.requests[i + 1:])
                    if attempt(c):
                        case, changed = c, True
                        break
    except StopSearch:
        pass
    return case


class StopSearch(KeyboardInterrupt):
    """Ends a hypothesis search from inside the condition (hypothesis re-raises KeyboardInterrupt
    and treats every other exception as a failure to shrink)."""
