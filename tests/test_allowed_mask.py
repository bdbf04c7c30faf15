"""KNOWN_UPSTREAM vllm#43894 (found by the sweep's stress on 0.28.0): a request without
allowed_token_ids restricted by a mask row an earlier request left. Its evidence counts exactly
the mechanism (harness/agents/vllm/masks.py): a sampling row masked, with the mask in force, for a
request that asked for no allowed_token_ids, per request, either arm. Here the agent's counter runs
over a stand-in of V1's InputBatch whose condense is vLLM's before 0.31.0 (the moved row's mask
copied, the old row left set) or after (cleared); the engine's own run is the reproducer
fixtures/vllm_upstream/allowed_ids_mask_swap.json (docs/results/2026-12-07-sweep-stress.md)."""
import json
from pathlib import Path

import torch

from harness.agents.vllm import masks, state
from harness.agents.vllm.steps import request_key
from harness.engine.request import Request
from harness.oracles import steps
from harness.search.served import claims
from harness.search.served.case import ServedCase
from harness.search.served.judge import Finding, Verdict, _classify
from harness.targets.vllm import releases as vr
from harness.targets.vllm import upstream as vllm_upstream

VOCAB, B, E = 16, [3, 4], [7, 8]


class _Batch:
    """The parts of V1's InputBatch the mask lives in: rows, the CPU mask tensor (True: masked),
    who asked, and condense as vLLM had it (`clears`: 0.31.0's fix)."""

    def __init__(self, clears: bool):
        self._req_ids, self.has_allowed_token_ids, self.clears = [], set(), clears
        self.allowed_token_ids_mask_cpu_tensor = torch.zeros(4, VOCAB, dtype=torch.bool)

    @property
    def req_ids(self):
        return self._req_ids

    @property
    def num_reqs(self):
        return len(self._req_ids)

    def add(self, rid, allowed=None):
        i = len(self._req_ids)
        self._req_ids.append(rid)
        if allowed:  # as add_request: the row set, then the allowed ids unmasked
            self.has_allowed_token_ids.add(rid)
            self.allowed_token_ids_mask_cpu_tensor[i] = True
            self.allowed_token_ids_mask_cpu_tensor[i][allowed] = False

    def finish(self, rid):  # remove_request, then condense (the last row moved into the hole)
        i = self._req_ids.index(rid)
        self.has_allowed_token_ids.discard(rid)
        self.allowed_token_ids_mask_cpu_tensor[i].fill_(False)
        last = len(self._req_ids) - 1
        if i != last:
            self._req_ids[i] = self._req_ids[last]
            self.allowed_token_ids_mask_cpu_tensor[i] = self.allowed_token_ids_mask_cpu_tensor[last]
            if self.clears:
                self.allowed_token_ids_mask_cpu_tensor[last].fill_(False)
        self._req_ids.pop()

    def _make_sampling_metadata(self):
        return "metadata"


def _phases(batch, build):
    """The reproducer's phases: a (plain) and b (B) run, a finishes, b moves, b finishes; then e (E)
    and the plain c."""
    batch.add("a")
    batch.add("b", B)
    build(batch)
    batch.finish("a")
    build(batch)
    batch.finish("b")
    batch.add("e", E)
    batch.add("c")
    build(batch)


class _Facts:
    def __init__(self):
        self.data = {}

    def add(self, k, n=1):
        self.data[k] = self.data.get(k, 0) + n

    def set(self, **kw):
        self.data.update(kw)


def _counted(monkeypatch, clears: bool) -> dict:
    facts = _Facts()
    monkeypatch.setattr(state, "facts", lambda role: facts)
    monkeypatch.setattr(masks, "_BY_RID", type(masks._BY_RID)())
    build = masks.make_sampling_metadata(_Batch._make_sampling_metadata)
    _phases(_Batch(clears), build)
    return facts.data


def test_a_row_left_masked_by_a_move_is_counted_for_the_plain_request_there(monkeypatch):
    got = _counted(monkeypatch, clears=False)
    assert got["foreign_allowed_mask_rows"] == 1
    assert got["request_evidence"] == {"c": {masks.MECHANISM: 1}}  # not b, e (they asked), not a (clear row)


def test_a_condense_that_clears_the_row_counts_nothing(monkeypatch):
    assert _counted(monkeypatch, clears=True) == {}


def test_without_a_request_that_asks_the_mask_is_not_in_force():
    batch = _Batch(clears=False)
    batch.add("c")
    batch.allowed_token_ids_mask_cpu_tensor[0, 2] = True  # a stale row, but nobody asks: vLLM applies no mask
    assert masks.foreign_rows(batch) == []
    batch.add("e", E)
    assert masks.foreign_rows(batch) == ["c"]


def test_the_workers_evidence_joins_the_requests_step_books():
    key = "k:8"
    facts = [{"role": "steps", "requests": {"r1": {"key": key, "evidence": {"prefix_hit": 1}}}},
             {"role": "worker", "request_evidence": {"r1": {masks.MECHANISM: 2}}},
             {"role": "worker", "request_evidence": {"r1": {masks.MECHANISM: 2}, "gone": {masks.MECHANISM: 1}}}]
    books = steps.books_of(facts)
    assert books == {"r1": {"key": key, "evidence": {"prefix_hit": 1, masks.MECHANISM: 2}}}  # ranks: the most
    assert masks.MECHANISM in steps.EITHER_ARM


def _finding(rid="c0r0"):
    return Finding("divergence", f"request {rid} diverges at token 0 (clear winner): off [79] vs on [3252]",
                   ("divergence",), "divergence", rid)


def test_the_entry_claims_only_with_the_mechanism_and_only_where_live():
    f = _finding()
    for version, ev, known in (("0.28.0", {masks.MECHANISM: 1}, True), ("0.28.0", {"prefix_hit": 1}, False),
                               ("0.32.0", {masks.MECHANISM: 1}, False), ("0.16.0", {masks.MECHANISM: 3}, True)):
        v = Verdict(new=[f], evidence={f.summary: ev})
        _classify(v, version, "v1")
        assert ([k for k, _ in v.known] == ["vllm#43894"]) is known, (version, ev, v.known)
        assert (v.new == []) is known


def test_the_claim_is_tested_without_allowed_token_ids():
    """The trigger a case can lose: every request's allowed_token_ids (vLLM then applies no mask)."""
    k = claims.entry("vllm#43894", "0.28.0", "v1")
    assert k is not None and claims.entry("vllm#43894", "0.31.0", "v1") is None
    plain = Request(rid="c0r0", prompt_ids=[1, 2], max_new_tokens=4)
    plain.extra = {}
    asks = Request(rid="c0r1", prompt_ids=[1], max_new_tokens=4)
    asks.extra = {"allowed_token_ids": [5, 6]}
    bare = claims.without(ServedCase([plain, asks], {}, []), k.cause)
    assert bare is not None and all("allowed_token_ids" not in r.extra for r in bare.requests)
    assert asks.extra == {"allowed_token_ids": [5, 6]}  # the case itself unchanged
    assert claims.without(ServedCase([plain], {}, []), k.cause) is None  # nothing to remove: not tested


def test_its_range_is_the_wheels_source_fact_and_its_reproducer_counts_it():
    k = next(k for k in vllm_upstream.KNOWN_UPSTREAM if k.id == "vllm#43894")
    s = vr.FACTS["allowed_mask_left_by_move"]
    assert (k.introduced, k.fixed) == (s.since, s.until) == ("", "0.31.0")
    assert "allowed_mask_left_by_move" in vr.SOURCE_CHECKS  # read from every cached wheel (test_vllm_releases)
    spec = json.loads(Path(k.reproducer).read_text())
    assert spec["fails_when"] == ["foreign_allowed_mask_rows"] and sum(spec["phases"]) == len(spec["requests"])
    assert [("allowed_token_ids" in b) for b in spec["requests"]] == [False, False, True, True, False]


def test_a_reproducer_in_phases_sends_each_phase_after_the_last_in_order(tmp_path, capsys):
    """fixtures/vllm_upstream/reproduce.py's phases: each phase's requests in order, a phase once the
    one before it is answered; phases that do not split the requests are one line, exit 2, before
    any server starts."""
    import threading
    import time

    from fixtures.vllm_upstream import reproduce
    log, lock = [], threading.Lock()

    def send(body):
        with lock:
            log.append(("sent", body["i"]))
        time.sleep(0.05 * (3 - body["i"] % 3))
        with lock:
            log.append(("answered", body["i"]))
        return {"text": [str(body["i"])]}
    out = reproduce._phased(send, [{"i": i} for i in range(5)], [1, 2, 2], 0.01)
    assert [x["text"] for x in out] == [[str(i)] for i in range(5)]
    sent = [i for what, i in log if what == "sent"]
    assert sent == [0, 1, 2, 3, 4]
    assert log.index(("sent", 3)) > max(log.index(("answered", 1)), log.index(("answered", 2)))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"id": "x", "what": "", "requests": [{}, {}], "phases": [1, 2]}))
    assert reproduce.main([str(bad)]) == 2
    assert capsys.readouterr().err.strip().endswith("phases [1, 2] do not split its 2 requests")


def test_a_reproducers_steps_are_json_in_the_order_bisect_reads():
    from fixtures.vllm_upstream.reproduce import step_rows
    books = steps.summed({"r1": {"key": "k:4", "scheduled": 5, "sampled": 4, "waited": 1},
                          "r2": {"key": "k:4", "scheduled": 3, "sampled": 3, "preempted": 1}})
    rows = json.loads(json.dumps(step_rows(books)))
    assert rows == {"k:4": [2, 8, 7, 1, 1]}


def test_either_arms_mask_is_the_requests_evidence_but_not_its_other_mechanisms():
    r = Request(rid="c0r0", prompt_ids=[1, 2], max_new_tokens=4)
    key = request_key([1, 2], 4)
    on = steps.summed({"x": {"key": key, "evidence": {"prefix_hit": 1}}})
    off = steps.summed({"y": {"key": key, "evidence": {masks.MECHANISM: 2, "stale_dropped:reset": 1}}})
    assert steps.evidence_of(on, r) == {"prefix_hit": 1}
    assert steps.evidence_of(on, r, off) == {"prefix_hit": 1, masks.MECHANISM: 2}  # the drop is async on's alone
