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


# -- the relay, the window's slots, the windows on vs off, overlap on the verify steps --

def req_at(rid, committed, allocated, prompt=8, output=()):
    return NS(rid=rid, kv=NS(kv_committed_len=committed, kv_allocated_len=allocated),
              origin_input_ids=list(range(prompt)), output_ids=list(output))


def table_batch(reqs, rows, seq_lens, roots, table, out, free=(), prev=None):
    """A verify batch as NGRAM leaves it: its req-pool rows, the req_to_token table, the window's
    slots (out_cache_loc), the allocator's free slots; `prev`: what the drafter spliced from the relay
    (overlap on: prev_token_ids, prev_accept_lens)."""
    batch = NS(forward_mode=Mode("verify"), reqs=reqs, seq_lens=torch.tensor(seq_lens),
               input_ids=torch.tensor([t for r in roots for t in [r] + [0] * (N - 1)]),
               req_pool_indices=torch.tensor(rows), out_cache_loc=torch.tensor(out),
               req_to_token_pool=NS(req_to_token=table),
               token_to_kv_pool_allocator=NS(free_pages=torch.tensor(list(free), dtype=torch.int64),
                                             release_pages=torch.empty(0, dtype=torch.int64)))
    worker = NS(draft_token_num=N, enable_overlap=prev is not None,
                prev_token_ids=prev[0] if prev else [], prev_accept_lens=prev[1] if prev else [])
    return worker, batch


def verified_at(b, reqs, seq_lens, accept_lens, rows):
    batch = NS(forward_mode=Mode("decode"), reqs=reqs, seq_lens=torch.tensor(seq_lens))
    result = NS(accept_lens=torch.tensor(accept_lens), next_token_ids=torch.tensor([t for r in rows for t in r]))
    b.verified(NS(draft_token_num=N), batch, result, True)


def two_requests():
    """Rows 1 and 2 of the table: request a holds slots 100.., b 200.. (18 and 28 reserved)."""
    table = torch.zeros(4, 40, dtype=torch.int64)
    table[1, :18] = torch.arange(100, 118)
    table[2, :28] = torch.arange(200, 228)
    return [req_at("a", 10, 18, prompt=10), req_at("b", 20, 28, prompt=20)], table


def test_relay_length_and_tokens_quiet_then_caught(tmp_path):
    b = books(tmp_path)
    reqs, table = two_requests()
    w, batch = table_batch(reqs, [1, 2], [10, 20], [5, 6], table, list(range(110, 114)) + list(range(220, 224)))
    b.window(w, batch)
    verified_at(b, reqs, [10, 20], [3, 1], [[7, 8, 9, 0], [11, 0, 0, 0]])
    # overlap on: the relay carried 13 / 21 and the accepted runs [7, 8, 9] / [11]
    w, batch = table_batch(reqs, [1, 2], [13, 21], [9, 11], table, list(range(113, 117)) + list(range(221, 225)),
                           prev=([7, 8, 9, 0, 11, 0, 0, 0], [3, 1]))
    b.window(w, batch)
    f = b.facts.data
    assert f["path_spec_relay_len"] == 2 and f["path_spec_relay_tokens"] == 2
    assert not f.get("spec_relay_len_wrong") and not f.get("spec_relay_tokens_wrong")
    verified_at(b, reqs, [13, 21], [2, 2], [[1, 2, 0, 0], [3, 4, 0, 0]])
    # the relay hands b the row of a (a stride or index error) and a length one short
    w, batch = table_batch(reqs, [1, 2], [15, 22], [2, 4], table, list(range(115, 119)) + list(range(222, 226)),
                           prev=([1, 2, 0, 0, 1, 2, 0, 0], [2, 2]))
    b.window(w, batch)
    assert f["spec_relay_tokens_wrong"] == 1 and f["spec_relay_len_wrong"] == 1
    assert "the drafter spliced [1, 2] from the relay, its previous step added [3, 4]" in f["first_spec_relay_tokens_violation"]
    assert "window starts at 22, its verify step started at 21 and added 2" in f["first_spec_relay_len_violation"]


def test_a_row_reused_after_a_finish_is_counted_and_its_relay_judged(tmp_path):
    b = books(tmp_path)
    reqs, table = two_requests()
    w, batch = table_batch(reqs[:1], [1], [10], [5], table, list(range(110, 114)))
    b.window(w, batch)
    verified_at(b, reqs[:1], [10], [1], [[7, 0, 0, 0]])
    c = req_at("c", 10, 18)  # a finished; c takes its req-pool row (and its relay entry)
    prefill(b, [c], [42])
    w, batch = table_batch([c], [1], [10], [42], table, list(range(110, 114)), prev=([7, 0, 0, 0], [1]))
    b.window(w, batch)  # the relay still holds a's token: caught
    f = b.facts.data
    assert f["path_spec_relay_reuse"] == 1
    assert "the drafter spliced [7] from the relay, its previous step added [42]" in f["first_spec_relay_tokens_violation"]


def test_window_slots_quiet_then_free_or_foreign_slots_caught(tmp_path):
    b = books(tmp_path)
    reqs, table = two_requests()
    w, batch = table_batch(reqs, [1, 2], [10, 20], [5, 6], table, list(range(110, 114)) + list(range(220, 224)),
                           free=range(300, 340))
    b.window(w, batch)
    f = b.facts.data
    assert f["path_spec_window_slots"] == 2 and not f.get("spec_window_slots_wrong")
    # a's window reaches past its 18 reserved cells: they hold a freed slot and one of b's
    table[1, 18:20] = torch.tensor([301, 205])
    w, batch = table_batch(reqs, [1, 2], [16, 20], [5, 6], table, [116, 117, 301, 205] + list(range(220, 224)),
                           free=range(300, 340))
    b.window(w, batch)
    assert f["spec_window_slots_wrong"] == 1
    assert "301 free, 205 row 1's" in f["first_spec_window_slots_violation"]


def test_context_spliced_twice_counted(tmp_path):
    b = books(tmp_path)
    reqs, table = two_requests()
    reqs[0].output_ids = [5]
    w, batch = table_batch(reqs[:1], [1], [10], [5], table, list(range(110, 114)))
    b.window(w, batch)
    verified_at(b, reqs[:1], [10], [2], [[7, 8, 0, 0]])
    assert b.unprocessed(reqs[0])  # its step in flight: output [5] does not hold 7, 8 yet
    reqs[0].output_ids = [5, 7, 8]  # processed (a prefill ran between the two decode steps)
    assert not b.unprocessed(reqs[0])
    w, batch = table_batch(reqs[:1], [1], [12], [8], table, list(range(112, 116)), prev=([7, 8, 0, 0], [2]))
    b.window(w, batch)
    f = b.facts.data
    assert f["spec_context_twice"] == 1 and "already among its 13 tokens" in f["first_spec_context_twice"]
    assert f["path_spec_prev_processed"] == 1


def test_a_window_of_a_request_released_before_the_launch(tmp_path):
    """NGRAM on a grammar batch takes the previous result after the batch was made: a request it
    finishes rides the step with its KV released (reservation 0, its slots free). Not a reservation
    violation (counted apart); its window writing another running request's slot still is."""
    b = books(tmp_path)
    reqs, table = two_requests()
    fin = req_at("f", 11, 0, prompt=6, output=range(6))
    fin.finished = lambda: True
    table[3, :15] = torch.arange(400, 415)  # its row still holds the freed slots
    w, batch = table_batch([fin] + reqs, [3, 1, 2], [11, 10, 20], [5, 5, 6], table,
                           [411, 412, 413, 414] + list(range(110, 114)) + list(range(220, 224)), free=range(400, 415))
    b.window(w, batch)
    f = b.facts.data
    assert f["path_spec_window_released"] == 1 and f["path_spec_reservation"] == 2
    assert not f.get("spec_past_reservation") and not f.get("spec_window_slots_wrong")
    table[3, 14] = 205  # a cell of its stale row now names b's slot
    w, batch = table_batch([fin] + reqs, [3, 1, 2], [11, 10, 20], [5, 5, 6], table,
                           [411, 412, 413, 205] + list(range(110, 114)) + list(range(220, 224)), free=range(400, 414))
    b.window(w, batch)
    assert f["spec_window_slots_wrong"] == 1 and "205 row 2's" in f["first_spec_window_slots_violation"]


def test_windows_recorded_and_compared_on_vs_off(tmp_path):
    from harness.oracles import spec_steps
    from harness.targets.sglang.spec import same_windows, windows_of
    arms = {}
    for arm, second in (("on", [3, 1]), ("off", [2, 1])):  # the same windows, another accepted length
        b = SpecBooks(plan_mod.Facts(str(tmp_path / arm), "sglang-scheduler"), window_len=N)
        reqs, table = two_requests()
        for r in reqs:
            r.sampling_params = NS(max_new_tokens=16)
        w, batch = table_batch(reqs, [1, 2], [10, 20], [5, 6], table, list(range(110, 114)) + list(range(220, 224)))
        b.window(w, batch)
        verified_at(b, reqs, [10, 20], [2, 1], [[7, 8, 0, 0], [11, 0, 0, 0]])
        w, batch = table_batch(reqs, [1, 2], [12, 21], [8, 11], table, list(range(112, 116)) + list(range(221, 225)))
        b.window(w, batch)
        verified_at(b, reqs, [12, 21], second, [[1, 2, 3, 0], [4, 0, 0, 0]])
        arms[arm] = windows_of([b.facts.data])
    keys = {k for k, _ in arms["on"].values()}
    assert same_windows(arms["on"], arms["on"], keys) == 4
    found, compared, _ = spec_steps.compare(arms["on"], arms["on"], keys)
    assert not found and compared == 2
    found, _, _ = spec_steps.compare(arms["on"], arms["off"], keys)
    assert len(found) == 1 and "window 1" in found[0]


def test_overlap_on_the_verify_steps_judged_by_its_share():
    from harness.targets.sglang.spec import overlap_line
    assert overlap_line({"spec_results": 80, "path_spec_one_step_old": 70})[0] is False
    lost, line = overlap_line({"spec_results": 80, "path_spec_one_step_old": 10, "spec_results_sync": 5})
    assert lost is True and "10 of 80" in line
    assert overlap_line({"spec_results": 5, "path_spec_one_step_old": 0})[0] is None
