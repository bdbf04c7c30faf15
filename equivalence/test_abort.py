"""Abort semantics as a gate case (issue 10, item 8). A client that goes away (the server
aborts on disconnect) calls Engine.abort between steps. Documented (Scheduler.abort): a
waiting request ends at once with no tokens and finish reason "abort"; a running one after
one more step, so with plain decoding it gets exactly one token more than it had when it was
aborted (overlap on or off: under overlap that step is already in flight), finish reason
"abort". Every other request's tokens are unchanged. Judged overlap on against off and
against the absolute reference (each request alone, no abort)."""
import random

import pytest

from harness.workloads import presets as workloads
from harness.engine.request import State
from harness.oracles.reference import INEXACT, absolute_reference, batch_invariant


def _plan(reqs, seed: int, waiting: bool) -> dict:
    """rid -> tokens seen when the client aborts it (0: abort while it still waits)."""
    rng = random.Random(seed)
    plan = {r.rid: rng.randint(1, max(1, r.max_new_tokens - 2)) for r in reqs[1::3]}
    if waiting:  # all arrive at once: the last one waits behind max_running when the first step ends
        plan[reqs[-1].rid] = 0
    return plan


def run_with_aborts(target, reqs, plan: dict, overlap: bool, **kw):
    """Run with the client aborting per `plan`; returns (run, rid -> (tokens it had at the abort,
    whether it was waiting then))."""
    at: dict[str, tuple[int, bool]] = {}

    def client(eng):
        for r in list(eng.sched.waiting) + list(eng.sched.running):
            m = plan.get(r.rid)
            if m is None or r.rid in at or r.finished:
                continue
            if (m == 0 and r.state is State.WAITING) or (m > 0 and len(r.output_ids) >= m):
                at[r.rid] = (len(r.output_ids), r.state is State.WAITING)
                eng.abort(r)
    return target.run(reqs, overlap=overlap, on_step=client, **kw), at


def abort_problems(run, at: dict, ref) -> list[str]:
    """What differs from the documented semantics, given the unaborted reference `ref`."""
    exact = {rid: (ids, fin) for rid, ids, fin in ref.outputs}
    out = []
    for rid, ids, fin in run.outputs:
        want, want_fin = exact[rid]
        had, waiting = at.get(rid, (None, False))
        if had is not None and len(want) > had:  # aborted before it would have finished
            n = had if waiting else had + 1  # a waiting request ends now, a running one after one more step
            want, want_fin = want[:n], "abort"
        if list(ids) != list(want) or fin != want_fin:
            k = next((i for i, (a, b) in enumerate(zip(want, ids)) if a != b), min(len(want), len(ids)))
            what = (f"aborted after {had} token(s){' while waiting' if waiting else ''}, it" if had is not None
                    else "not aborted, it")
            out.append(f"request {rid}: {what} got {len(ids)} token(s) ({fin}), documented {len(want)} "
                       f"({want_fin}); first difference at token {k}")
    return out


@pytest.mark.parametrize("preset", ["greedy", "mixed"])
def test_abort_running_and_waiting(target, tok, oh_options, preset):
    if not getattr(target, "white_box", False):
        pytest.skip(f"the abort case drives Engine.abort between steps; {target.name} has no such hook")
    if not batch_invariant(target):  # its reference is each request alone, token for token
        pytest.skip(INEXACT.split(":")[0] + ": the abort case needs an exact reference")
    for seed in range(oh_options.seeds or 1):
        reqs = workloads.row_reuse(tok, n=10, seed=seed) if preset == "greedy" else workloads.mixed(tok, 10, seed)
        for r in reqs:
            r.max_new_tokens += 6
            r.abort_after = None  # only the client aborts here
        kw = dict(max_running=4)
        plan = _plan(reqs, seed, waiting=preset == "greedy")
        ref = absolute_reference(target, reqs, **kw)
        runs = {ov: run_with_aborts(target, reqs, plan, ov, **kw) for ov in (False, True)}
        kinds = {w for _, w in runs[True][1].values()}
        assert kinds == ({False, True} if preset == "greedy" else {False}), f"seed {seed}: aborted kinds {kinds}"
        for ov, (run, at) in runs.items():
            bad = abort_problems(run, at, ref)
            assert not bad, f"seed {seed}, overlap {'on' if ov else 'off'}: {bad[0]}"
        assert runs[True][0].outputs == runs[False][0].outputs, f"seed {seed}: aborts differ overlap on vs off"
