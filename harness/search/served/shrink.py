"""Shrinking a served case: delta debugging that keeps every step that still fails the same way.

Each try costs a run on both servers (seconds), so the order is by what buys most per try: the
request the failure names alone (a divergence names one: most bugs need only it), halves of the
requests, then single requests, the controls, the delays, then each request made
plainer (no disconnect, arrival 0, one parameter dropped at a time, n 1, greedy, max_tokens and
prompt halved). A try that does not fail is dropped (after `runs` runs: the caller gives a failure
it saw miss a second run per try): a timing-dependent failure can miss, which costs a
simplification, never a wrong reproducer (the caller replays the result).
"""
from __future__ import annotations

import time

from harness.search.served.case import ServedCase, clone, clone_request


class _Spent(Exception):
    pass


def _request_variants(r):
    """Plainer versions of one request, one change each."""
    def v(**kw):
        c = clone_request(r)
        for k, x in kw.items():
            setattr(c, k, x)
        return c
    if r.abort_after is not None:
        yield v(abort_after=None)
    if r.arrival:
        yield v(arrival=0)
    if len(r.extra.get("chat") or ()) > 1:  # a conversation one turn shorter
        c = v()
        c.extra["chat"] = c.extra["chat"][:-1]
        yield c
    for k in sorted(r.extra):
        c = v()
        del c.extra[k]
        if k == "min_tokens":
            c.extra.pop("stop_token_ids", None)
        yield c
    if r.stop:
        yield v(stop=())
    if r.repetition_penalty != 1.0:
        yield v(repetition_penalty=1.0)
    if getattr(r, "n", 1) > 1:
        yield v(n=1)
    if r.temperature > 0 and getattr(r, "n", 1) == 1:
        yield v(temperature=0.0, top_p=1.0, seed=None)
    if r.ignore_eos:
        yield v(ignore_eos=False)
    if r.max_new_tokens > 1:
        yield v(max_new_tokens=max(1, r.max_new_tokens // 2))
        yield v(max_new_tokens=r.max_new_tokens - 1)
    keep = 1  # the first token stays (a BOS where the model has one)
    if len(r.prompt_ids) > keep + 8:
        n = len(r.prompt_ids) - keep
        yield v(prompt_ids=r.prompt_ids[:keep] + r.prompt_ids[keep + n // 2:])
        yield v(prompt_ids=r.prompt_ids[:keep + n // 2])


def shrink(case: ServedCase, still_fails, deadline: float, history: list | None = None,
           runs: int = 1, focus=()) -> tuple[ServedCase, int]:
    """The smallest case found before `deadline` (time.monotonic()) that `still_fails` in one of
    `runs` runs; and the tries. `history` (a list) gets every accepted case, oldest first (to fall
    back on one that replays). `focus`: rids the failure names, each tried alone first."""
    tries = [0]

    def attempt(c: ServedCase) -> bool:
        if time.monotonic() > deadline:
            raise _Spent()
        tries[0] += 1
        ok = still_fails(c)
        for _ in range(runs - 1):
            if ok or time.monotonic() > deadline:
                break
            ok = still_fails(c)
        if ok and history is not None:
            history.append(c)
        return ok

    def with_requests(reqs):
        c = clone(case)
        c.requests = [clone_request(r) for r in reqs]
        return c
    try:
        for rid in focus:
            alone = [r for r in case.requests if r.rid == rid]
            if alone and len(case.requests) > 1 and attempt(with_requests(alone)):
                case = with_requests(alone)
                break
        changed = True
        while changed:
            changed = False
            n = len(case.requests)
            for chunk in (n // 2, 1):  # halves first (ddmin), then one request at a time
                i = 0
                while chunk and len(case.requests) > 1 and i < len(case.requests):
                    rest = case.requests[:i] + case.requests[i + chunk:]
                    if rest and attempt(with_requests(rest)):
                        case, changed = with_requests(rest), True
                    else:
                        i += chunk
            for j in range(len(case.controls)):
                c = clone(case)
                del c.controls[j]
                if attempt(c):
                    case, changed = c, True
                    break
            for k in sorted(case.delays):
                c = clone(case)
                del c.delays[k]
                if attempt(c):
                    case, changed = c, True
            for i in range(len(case.requests)):
                for r in _request_variants(case.requests[i]):
                    c = with_requests(case.requests[:i] + [r] + case.requests[i + 1:])
                    if attempt(c):
                        case, changed = c, True
                        break
    except _Spent:
        pass
    case.cases = 1 if len({r.rid.split("r")[0] for r in case.requests}) <= 1 else case.cases
    return case, tries[0]
