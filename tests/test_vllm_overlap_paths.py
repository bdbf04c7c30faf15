"""Overlap per path and in the worker against real vLLM (issue 36, item 4), scheduled tier: the
path workload costs about 90 s an arm and each patch a restart of the async-on server. Its fast
representative in .ci/run is tests/test_path_overlap.py (the same rules on event sequences), and
every stock gate judges each path row's share (equivalence/test_paths.py, overlap_on_row).

- stock 0.32.0 keeps its overlap on every path row, and its worker never waits for the previous
  step's copy before a forward (the quiet halves);
- `chunked_prefill_waits_in_flight` (a resumed request's recompute chunk holds the whole step):
  the run as a whole stays effective and the steps oracle sees nothing (an empty schedule is no
  step), but the chunked prefill's path is `overlap: LOST on chunked_prefill (its prefill steps)`;
- `worker_waits_previous_copy`: the engine core's order is unchanged; the worker's own clock
  says its forwards began only once the previous step's copy had landed.

Needs `overlap-harness setup vllm`, as tests/test_vllm.py (whose server pair it shares)."""
import time

import pytest

from harness.agents import plan as planmod
from harness.oracles import path_overlap, steps
from harness.targets.vllm import paths as vp
from harness.targets.vllm import workload as vllm_workload
from harness.workloads import presets as workloads

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.scheduled]
CHUNK = "chunked_prefill_waits_in_flight"
WORKER = "worker_waits_previous_copy"
SLOW_COPY = {"output_copy": {"p": 1.0, "steps": 1.5}}  # the copy as slow as a device's: something to hide


def _books_on(target, tok):
    """The path workload, async on; its requests and their steps books (with the per-request
    overlap verdicts). A run-level LOST raises TargetError here."""
    reqs = vllm_workload.build(tok, seed=0)
    target.url(True)
    before = steps.books_of(planmod.read_facts(str(target.facts_dir(True))))
    vllm_workload.run_with_controls(target, reqs, True)
    target.idle_books(True)
    time.sleep(0.4)  # the agent flushes its facts every 0.1 s
    return reqs, steps.new_since(before, steps.books_of(planmod.read_facts(str(target.facts_dir(True)))))


def _verdicts(reqs, books):
    out = {}
    for row in vp.PATHS:
        if row.pair == "bare" or row.cpu_reason:
            continue
        out[row.name] = path_overlap.judge_row(row.name, books, [r for r in reqs if row.name in r.paths], reqs)
    return out


def test_stock_overlaps_on_every_path(vllm, tok):
    reqs, books = _books_on(vllm, tok)
    v = _verdicts(reqs, books)
    assert not [line for lost, line, _ in v.values() if lost], [line for lost, line, _ in v.values() if lost]
    judged = [name for name, (lost, _, _) in v.items() if lost is False]
    assert "chunked_prefill" in judged and len(judged) >= 10, v  # measured: 20 rows judged, every wait overlapped


@pytest.mark.on_server(CHUNK)
def test_a_held_recompute_chunk_is_lost_on_its_path_only(vllm, tok):
    from harness import targets
    try:
        assert targets.make_target("vllm", {CHUNK}) is vllm
        reqs, books = _books_on(vllm, tok)  # the run-level oracle passes it (it would raise)
    finally:
        targets.make_target("vllm", ())
    v = _verdicts(reqs, books)
    lost, line, _ = v["chunked_prefill"]
    assert lost is True and line.startswith("overlap: LOST on chunked_prefill"), line
    assert v["abort"][0] is False and v["seeded_reorder"][0] is False, (v["abort"], v["seeded_reorder"])


def _worker_line(target):
    facts = planmod.read_facts(str(target.facts_dir(True)))
    return target.overlap_verdict(facts, target.facts_before)[1]


def test_stock_worker_overlaps_its_copies(vllm, tok):
    vllm.run(workloads.mixed(tok, 8, seed=0), overlap=True, delays=SLOW_COPY, seed=0)
    line = _worker_line(vllm)
    assert "worker: 0 of " in line, line
    judged = int(line.split("worker: 0 of ")[1].split()[0])
    assert judged >= 4, line


@pytest.mark.on_server(WORKER)
def test_a_worker_waiting_for_the_copy_is_lost(vllm, tok):
    from harness import targets
    from harness.targets.base import TargetError
    try:
        assert targets.make_target("vllm", {WORKER}) is vllm
        with pytest.raises(TargetError, match="the worker began step N\\+1's forward only after"):
            vllm.run(workloads.mixed(tok, 8, seed=0), overlap=True, delays=SLOW_COPY, seed=0)
    finally:
        targets.make_target("vllm", ())
