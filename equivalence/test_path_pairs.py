"""vLLM's path features two at a time (issue 44, item 2): the gate's suite for what races/test_combos
is on the ref engine. The plan and the rule are harness/targets/vllm/combos.py.

Each row of a strength-2 covering array over the features (abort, prefix hit, preemption with a step
in flight, chunked prefill, structured output, prompt logprobs, penalty, seed) turns its features on
for the same few requests, and runs once per arm (one run per row: the engine's books at idle are
then the row's). What met is counted per request from the agent's books and the answers, both
arms, and recorded per pair (`pairs met`); a planned pair no request met fails the case as `not
exercised`. A books finding at idle fails a row; it is named by its pair: the pairs every failing
row turns on and no clean row does, each run again in a row with only its two features on (one
that still fails alone is named plainly, the rest `(not alone)`). A leak outlives its row, so the
async-on server starts again after a failing one. A feature the release, runner or configuration
lacks (its path row absent) leaves the plan, its pairs n/a.

Stock 0.32.0: quiet. The source patch abort_shared_prefix_double_ref (an aborted request's shared
cached prefix blocks taken once more) breaks only where abort meets a prefix hit, and this suite
names `abort x prefix_hit` (tests/test_vllm_combos.py, scheduled; the plan's fast representative
is tests/test_vllm_combos_plan.py).
"""
import itertools
import time
from dataclasses import dataclass

import pytest

from harness.oracles import books as bookmod
from harness.oracles import steps
from harness.search.served.case import ServedCase
from harness.search.served.judge import run_arm
from harness.targets.vllm import combos
from harness.verdict import outcome

AGAIN = 50  # a row run again takes this added to its index: its own prompts, no block of its first run


def _features(target) -> tuple[dict, dict]:
    """(feature -> its description, feature -> why it is n/a here) for this target."""
    absent = {}
    for f, rows in combos.PATH_ROWS.items():
        why = next((w for w in (target.row_absent(r) for r in rows) if w), "")
        if why:
            absent[f] = why
    return {f: d for f, d in combos.FEATURES.items() if f not in absent}, absent


@dataclass(frozen=True)
class Lost:
    """A server lost in a row's run: its line, and the live known-upstream entry whose crash it
    was (ServedTarget.known_crash), if any."""
    line: str
    known: str = ""


def run_row(target, tok, row: dict, i: int):
    """Row `i` on both arms: (its requests, overlap -> (StepBooks, {rid: ids}, books at idle) or the
    Lost server of the run)."""
    reqs, controls = combos.mix(tok, row, i)
    out = {}
    for overlap in (False, True):
        crashes = len(getattr(target, "crashes", ()))
        a = run_arm(target, ServedCase(reqs, {}, controls), overlap)
        if "error" in a:
            new = getattr(target, "crashes", [])[crashes:]
            out[overlap] = Lost(a["error"].summary, new[-1].get("known", "") if new else "")
            continue
        out[overlap] = (steps.summed(a["steps"]), {rid: ids for rid, ids, _ in a["run"].outputs}, a["books"])
    return reqs, out


def known_deaths(res: dict) -> list[Lost]:
    """The row's servers a live known bug killed: the row is that entry's, not a books finding (the
    0.13.0 sweep failed this case as `books.leak` on the known prompt-logprobs crash)."""
    return [r for r in res.values() if isinstance(r, Lost) and r.known]


def leaks(res: dict) -> list[str]:
    """The row's books findings at idle (the line of a server lost to no known bug first)."""
    lost = [r for r in res.values() if isinstance(r, Lost)]
    if lost:
        return [r.line for r in lost if not r.known]
    # a host buffer alone at idle is not judged: the worker writes its books before the output
    # thread frees the last step's buffer (as the served judge does, harness.search.served.judge)
    held = bookmod.HELD["host_buffers_held"]
    return [f for f in bookmod.findings(res[True][2], res[False][2]) if held not in f]


def fresh_on_server(target) -> None:
    """A leak outlives its row: the async-on server starts again at its next use."""
    s = target.servers.pop(True, None)
    if s is not None:
        s.stop()


def sweep(target, tok, arr, rows=None, label: int = 0, met=None, failing=None, lines=None, known=None):
    """The rows (`rows`: their indices, default every one; `label`: added to a row's index in its
    requests' prompts and ids, so a row run again shares no cached block with its first run): (pair ->
    [requests that met it async on, async off], failing row -> its first finding, row -> a line with
    its features, seconds and books), added to those given; `known` (row -> Lost) gets the rows a
    live known bug's crash ended."""
    met, failing, lines = met if met is not None else {}, failing if failing is not None else {}, lines or {}
    known = known if known is not None else {}
    for i in (range(len(arr.rows)) if rows is None else rows):
        row = arr.rows[i]
        t0 = time.monotonic()
        reqs, res = run_row(target, tok, row, label + i)
        arms = {o: (r[0], r[1]) if isinstance(r, tuple) else (steps.StepBooks(), {}) for o, r in res.items()}
        for p, (n_on, n_off) in combos.count_pairs(reqs, arms).items():
            acc = met.setdefault(p, [0, 0])
            acc[0] += n_on
            acc[1] += n_off
        bad, died = leaks(res), known_deaths(res)
        if died:
            known.setdefault(i, died[0])
        lines[(i, label)] = (f"row {i}{' again' if label else ''} ({'+'.join(f for f, v in row.items() if v) or 'none'}): "
                             f"{time.monotonic() - t0:.1f} s, " + ('books: ' + bad[0] if bad else 'KNOWN UPSTREAM '
                             + died[0].known + ': ' + died[0].line[:160] if died else 'books back'))
        if bad:
            failing.setdefault(i, bad[0])
            fresh_on_server(target)
    return met, failing, lines


def unmet(planned, met) -> list[tuple[str, str]]:
    return sorted(p for p in planned if not sum(met.get(p, [0, 0])))


def named(target, tok, arr, failing: dict) -> list[str]:
    """The failing rows' pairs, each alone again: named plainly when it still fails, else `(not alone)`."""
    clean = [i for i in range(len(arr.rows)) if i not in failing]
    out = []
    for pair in combos.suspects(arr, list(failing), clean):
        _, res = run_row(target, tok, {f: f in pair for f in arr.factors}, 90 + len(out))
        alone = bool(leaks(res))
        if alone:
            fresh_on_server(target)
        out.append(combos.pair_name(pair) + ("" if alone else " (not alone)"))
    return out


def test_pairs_meet_and_books_come_back(target, tok, record_property):
    if target.name != "vllm" or not getattr(target, "paths", False):
        pytest.skip(f"vLLM's path features (its agent counts them per request); target {target.name}")
    features, absent = _features(target)
    if len(features) < 2:
        outcome.na("; ".join(absent.values()))
    arr = combos.plan(tuple(features))
    known: dict = {}
    met, failing, lines = sweep(target, tok, arr, known=known)
    planned = combos.planned_pairs(arr)
    # timing decides some pairs (a reset must land while a request decodes): the rows that plan a pair
    # no request met run once more, under new prompts, before it is called not exercised
    again = sorted({i for i, row in enumerate(arr.rows) if any(row[a] and row[b] for a, b in unmet(planned, met))})
    if again:
        sweep(target, tok, arr, again, AGAIN, met, failing, lines, known)
    for p in itertools.combinations(combos.FEATURES, 2):
        on, off = met.get(p, [0, 0])
        n = ("n/a" if p not in planned else f"{on}/{off}" if on + off else "not exercised")
        record_property("pairs_met", f"{combos.pair_name(p)}={n}")
    print("\n".join(lines.values()))
    if failing:
        first = failing[min(failing)]
        outcome.fail(f"{', '.join(named(target, tok, arr, failing)) or 'no pair in common'}: {first} "
                     f"(rows {sorted(failing)} of {len(arr.rows)})", "books.leak")
    missing = [combos.pair_name(p) for p in unmet(planned, met)]
    if known:  # a known crash's trigger is left out of every request since (ServedTarget.leave_out):
        # the pairs it holds may stay unmet because of it; said with the entry, never a pass
        first = known[min(known)]
        outcome.known(first.known, f"{first.line} (rows {sorted(known)} of {len(arr.rows)})"
                      + (f"; not exercised since ({len(missing)} of {len(planned)} planned pairs): "
                         + ", ".join(missing) if missing else ""))
    if missing:
        outcome.not_exercised(f"not exercised ({len(missing)} of {len(planned)} planned pairs): "
                              + ", ".join(missing))
