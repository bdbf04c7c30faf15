"""vLLM's path features two at a time, against real vLLM (issue 44, item 2; the plan and the rule
are harness/targets/vllm/combos.py, the ref engine's races/test_combos.py).

Each row of the covering array runs once per arm on the path pair (one run per row: the books at
idle are then the row's). What met is counted per request from the agent's books and the answers
(both arms); a planned pair that no request met is listed `not exercised` (timing decides some:
a reset must land while the row's requests run). A books finding at idle fails the row; it is
named by its pair: the pairs every failing row turns on and no clean row does, each run again in
a row with only its two features on (the one that still fails alone is named plainly, the rest
`(not alone)`). After a failing row the async-on server starts again (a leak outlives its row).

Stock 0.32.0 is quiet; the source patch abort_shared_prefix_double_ref (an aborted request's
shared cached prefix blocks taken once more) breaks only where abort meets a prefix hit and is
named `abort x prefix_hit`. Its own pair and several minutes: the scheduled tier; the fast
representative is tests/test_vllm_combos_plan.py."""
import pytest

from harness.oracles import books as bookmod
from harness.oracles import steps
from harness.search.served.case import ServedCase
from harness.search.served.judge import run_arm
from harness.targets.vllm import combos
from tests.served_pair import own_vllm_pairs  # noqa: F401 (the module's `pairs` fixture)

pytestmark = [pytest.mark.vllm, pytest.mark.own_servers, pytest.mark.scheduled, pytest.mark.slow]
PATCH = "abort_shared_prefix_double_ref"
ARRAY = combos.plan()


def run_row(t, tok, row: dict, i: int, arms=(False, True)) -> dict:
    """overlap -> (StepBooks, {rid: ids}, books at idle); a server lost in the run: an error line."""
    reqs, controls = combos.mix(tok, row, i)
    out = {}
    for overlap in arms:
        a = run_arm(t, ServedCase(reqs, {}, controls), overlap)
        if "error" in a:
            out[overlap] = a["error"].summary
            continue
        out[overlap] = (steps.summed(a["steps"]), {rid: ids for rid, ids, _ in a["run"].outputs}, a["books"])
    return reqs, out


def leaks(res: dict) -> list[str]:
    on = res.get(True)
    if isinstance(on, str):
        return [on]
    off = res.get(False)
    bad = bookmod.findings(on[2], off[2] if isinstance(off, tuple) else {})
    # a host buffer alone at idle is not judged: the worker writes its books before the output
    # thread frees the last step's buffer (as the served judge does, harness.search.served.judge)
    held = bookmod.HELD["host_buffers_held"]
    return [f for f in bad if held not in f]


def fresh_on_server(t) -> None:
    """A leak outlives its row: the async-on server starts again (its next use)."""
    s = t.servers.pop(True, None)
    if s is not None:
        s.stop()


def sweep(t, tok, arms=(False, True)):
    """Every row: (pair -> [met on, met off], failing rows with their first finding)."""
    met, failing = {}, {}
    for i, row in enumerate(ARRAY.rows):
        reqs, res = run_row(t, tok, row, i, arms)
        both = {o: (r[0], r[1]) for o, r in res.items() if isinstance(r, tuple)}
        for p, (n_on, n_off) in combos.count_pairs(reqs, {o: both.get(o, (steps.StepBooks(), {})) for o in (True, False)}).items():
            acc = met.setdefault(p, [0, 0])
            acc[0] += n_on
            acc[1] += n_off
        bad = leaks(res)
        if bad:
            failing[i] = bad[0]
            fresh_on_server(t)
    return met, failing


def named(t, tok, failing: dict) -> list[str]:
    """The failing rows' pairs, each alone again: plainly named when it still fails, else `(not alone)`."""
    clean = [i for i in range(len(ARRAY.rows)) if i not in failing]
    out = []
    for pair in combos.suspects(ARRAY, list(failing), clean):
        row = {f: f in pair for f in combos.FEATURES}
        _, res = run_row(t, tok, row, 90 + len(out), arms=(False, True))
        alone = bool(leaks(res))
        if alone:
            fresh_on_server(t)
        out.append(combos.pair_name(pair) + ("" if alone else " (not alone)"))
    return out


def test_pairs_meet_on_stock_and_a_leak_where_two_meet_is_named_by_its_pair(pairs):
    t = pairs.get("vllm")
    tok = t.tokenizer()
    met, failing = sweep(t, tok)
    planned = combos.planned_pairs(ARRAY)
    print("pairs met (requests, async on/off): " + ", ".join(
        f"{combos.pair_name(p)} {met.get(p, [0, 0])[0]}/{met.get(p, [0, 0])[1]}" for p in sorted(planned)))
    missed = sorted(combos.pair_name(p) for p in planned if not sum(met.get(p, [0, 0])))
    print(f"not exercised ({len(missed)} of {len(planned)} planned pairs): {', '.join(missed) or 'none'}")
    assert failing == {}, failing  # stock: every row's books back at idle
    assert sum(met.get(("abort", "prefix_hit"), [0, 0])) > 0, "abort x prefix_hit never met: the patch below would prove nothing"
    t = pairs.get("vllm", {PATCH})
    _, failing = sweep(t, tok, arms=(True,))  # the off arm is stock: its books are the reference
    names = named(t, tok, failing)
    print(f"patched {PATCH}: rows failing {sorted(failing)}; named: {', '.join(names)}; first: "
          f"{next(iter(failing.values()), '')[:200]}")
    assert "abort x prefix_hit" in names, (names, failing)
