"""The agent's speculative books (harness/agents/sglang/spec.py) on batches made as SGLang's NGRAM
worker leaves them: quiet on a correct relay and reservation, and each judgement catching its fault
(a window past the reserved slots; a window that does not start with its request's bonus token, on
a row past the first of a batch)."""
from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

torch = pytest.importorskip("torch")

from harness.agents import plan as plan_mod  # noqa: E402
from harness.agents.sglang.spec import SpecBooks  # noqa: E402
from harness.targets.sglang.spec import acceptance_line  # noqa: E402

N = 4  # the window


class Mode:
    def __init__(self, name):
        self.name = name

    def is_decode(self):
        return self.name == "decode"

    def is_target_verify(self):
        return self.name == "verify"


def req(rid, committed, allocated):
    return NS(rid=rid, kv=NS(kv_committed_len=committed, kv_allocated_len=allocated))


def books(tmp_path):
    return SpecBooks(plan_mod.Facts(str(tmp_path), "sglang-scheduler"), window_len=N)




def window(b, reqs, seq_lens, roots):
    batch = NS(forward_mode=Mode("verify"), reqs=reqs, seq_lens=torch.tensor(seq_lens),
               input_ids=torch.tensor([t for r in roots for t in [r] + [0] * (N - 1)]))
    b.window(NS(draft_token_num=N), batch)


def verified(b, reqs, accept_lens, rows):
    batch = NS(forward_mode=Mode("decode"), reqs=reqs)
    result = NS(accept_lens=torch.tensor(accept_lens), next_token_ids=torch.tensor([t for r in rows for t in r]))
    b.verified(NS(draft_token_num=N), batch, result, True)


def prefill(b, reqs, tokens):
    batch = NS(forward_mode=Mode("extend"), reqs=reqs)
    b.verified(NS(draft_token_num=N), batch, NS(accept_lens=torch.ones(len(reqs), dtype=torch.int32),
                                               next_token_ids=torch.tensor(tokens)), False)


def test_quiet_on_a_correct_overlapped_run(tmp_path):
    b = books(tmp_path)
    r0, r1 = req("a", 10, 18), req("b", 20, 28)  # two windows reserved beyond each count
    prefill(b, [r0, r1], [5, 6])
    window(b, [r0, r1], [10, 20], [5, 6])
    verified(b, [r0, r1], [3, 1], [[7, 8, 9, 0], [11, 0, 0, 0]])
    # overlap: the CPU still counts 10 / 20 (step in flight), the relay's lengths are 13 / 21
    window(b, [r0, r1], [13, 21], [9, 11])
    verified(b, [r0, r1], [4, 2], [[1, 2, 3, 4], [12, 13, 0, 0]])
    f = b.facts.data
    assert f.get("spec_past_reservation", 0) == 0 and f.get("spec_bonus_wrong", 0) == 0
    assert f["path_spec_reservation"] == 4 and f["path_spec_second_window"] == 2  # 13 + 4 > 10 + 4, 21 + 4 > 20 + 4
    assert f["path_spec_bonus"] == 4 and f["path_spec_bonus_batched"] == 2
    assert f["spec_verify_steps"] == 2 and f["spec_drafts_proposed"] == 12 and f["spec_drafts_accepted"] == 6
    assert f["path_spec_accepted"] == 3 and f["path_spec_rejected"] == 3
    assert f["spec_accept_hist"] == {"3": 1, "1": 1, "4": 1, "2": 1}
    assert "6 of 12 drafts accepted (50%)" in acceptance_line(
        {k: v for k, v in f.items() if isinstance(v, int)}, "on")


def test_a_window_past_the_reservation_is_caught(tmp_path):
    b = books(tmp_path)
    r0 = req("a", 10, 14)  # one window reserved: the lagging count leaves the next window short
    prefill(b, [r0], [5])
    window(b, [r0], [13], [5])
    f = b.facts.data
    assert f["spec_past_reservation"] == 1
    assert "window [13, 17) past its reservation of 14 slots" in f["first_spec_reservation_violation"]


def test_a_wrong_bonus_token_past_the_first_row_is_caught(tmp_path):
    b = books(tmp_path)
    reqs = [req("a", 10, 18), req("b", 20, 28), req("c", 30, 38)]
    prefill(b, reqs, [5, 6, 7])
    window(b, reqs, [10, 20, 30], [5, 6, 7])
    verified(b, reqs, [2, 3, 1], [[40, 41, 0, 0], [50, 51, 52, 0], [60, 0, 0, 0]])
    window(b, reqs, [12, 23, 31], [41, 41, 60])  # row 1 spliced row 0's tokens (a stride error)
    f = b.facts.data
    assert f["spec_bonus_wrong"] == 1
    assert "request b (row 1 of 3): window starts with token 41, its last accepted token was 52" \
        in f["first_spec_bonus_violation"]
