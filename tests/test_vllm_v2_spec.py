"""The V2 agent's speculative windows (harness.agents.vllm.v2.spec): what it records after V2's
sample, from a batch laid out as V2's InputBatch lays one out (no vLLM needed)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from harness.agents.vllm.v2 import spec
from harness.oracles import spec_steps


def _batch():
    # three requests: a (2 drafts), b (no drafts: one logits row), c (3 drafts, a step that starts
    # inside its prefill: its draft slots are placeholders V2's rejection sampler rejects)
    input_ids = torch.tensor([5, 11, 12, 7, 40, 41, 42, 43, 44])
    positions = torch.tensor([20, 21, 22, 9, 2, 3, 4, 5, 6])
    return SimpleNamespace(
        num_reqs=3, req_ids=["a", "b", "c"], num_draft_tokens=5, idx_mapping_np=np.array([4, 0, 2]),
        cu_num_logits_np=np.array([0, 3, 4, 8], dtype=np.int32),
        logits_indices=torch.tensor([0, 1, 2, 3, 5, 6, 7, 8]), input_ids=input_ids, positions=positions)


def test_windows_read_the_drafts_at_the_logits_rows_after_the_first():
    prefill = np.zeros(8, dtype=np.int64)
    prefill[[4, 0, 2]] = [10, 5, 5]  # c's step starts at position 3 < its prefill of 5
    sampled = [[11, 30, -1], [8, -1, -1], [50, -1, -1, -1]]
    got = spec.windows(_batch(), sampled, [2, 1, 1], lambda rid: rid != "b", prefill)
    assert got == [("a", [11, 12], [11, 30]), ("c", [-1, -1, -1], [50])]  # b: its first token, no window
    again = spec.windows(_batch(), sampled, [2, 1, 0], lambda rid: True, prefill)
    assert [w[0] for w in again] == ["a", "b"]  # c kept nothing (a partial prefill): no window
    assert again[1] == ("b", [], [8])  # a later sample without drafts: a window with none
    found, n = spec_steps.verify_findings({"a": ["ka", [got[0][1:]]]}, ["ka"], "on")
    assert n == 1 and not found  # accepted 11, then 30 (not the next draft 12): the rule holds


def test_a_mismatch_accepted_breaks_the_verify_rule():
    found, _ = spec_steps.verify_findings({"a": ["ka", [[[11, 12], [11, 12]]]]}, ["ka"], "on")
    assert found  # 12 kept after 11 as the correction, though it is the next draft



def test_drafts_the_grammar_let_through_are_the_only_ones_verified():
    """Async, V2's drafts reach the grammar after the forward: the rejection sampler rejects those past
    the grammar's num_acceptable_drafts whatever the target says (vLLM's grammar_invalid_drafts). The
    first 10-minute drafter stress (seed 36, spec-ngram-k1, 2026-12-07) found "drafts [2] verified as
    [2]": a terminated regex (ignore_eos) invalidated the drafted EOS, then EOS was sampled. Recorded
    as -1 there, the verify rule holds; a grammar that lets every draft through changes nothing."""
    prefill = np.zeros(8, dtype=np.int64)
    sampled = [[11, 30, -1], [8, -1, -1], [50, -1, -1, -1]]
    out = SimpleNamespace(structured_output_request_ids=["a"], num_acceptable_drafts=[0])
    acc = spec.acceptable_drafts(out)
    assert acc == {"a": 0} and spec.acceptable_drafts(None) == {}
    assert spec.acceptable_drafts(SimpleNamespace(structured_output_request_ids=["a"], num_acceptable_drafts=None)) == {"a": 0}
    got = spec.windows(_batch(), [[11, -1, -1], *sampled[1:]], [1, 1, 1], lambda rid: True, prefill, acc)
    assert got[0] == ("a", [-1, -1], [11])  # 11 sampled where the grammar refused the draft 11
    assert not spec_steps.verify_findings({"a": ["ka", [got[0][1:]]]}, ["ka"], "on")[0]
    assert spec_steps.verify_findings({"a": ["ka", [[[11, 12], [11]]]]}, ["ka"], "on")[0]  # unmarked: the finding
    assert spec.windows(_batch(), sampled, [2, 1, 1], lambda rid: True, prefill, {"a": 2})[0] == ("a", [11, 12], [11, 30])
