"""harness.oracles.divergence: the first divergent position, both continuations, and the near-tie verdict."""
from harness.oracles.divergence import compare, compare_runs, first_difference, report
from harness.targets.ref import RefTarget


def lp(chosen, *top):
    return (chosen, list(top))


def test_identical_outputs_have_no_divergence():
    out = [("a", [1, 2, 3], "length"), ("b", [4], "stop")]
    assert compare(out, list(out)) == []


def test_first_difference_and_continuations():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    d, = compare([("a", [1, 2, 3, 4], "length")], [("a", [1, 2, 9, 8], "length")])
    assert (d.rid, d.position, d.expected, d.got) == ("a", 2, [3, 4], [9, 8])
    assert d.near_tie is None  # no log-probabilities given


def test_near_tie_from_the_top_two():
    # position 1: tokens 7 and 9 within 0.001 nats in both runs -> rounding
    off = {"a": [lp(-0.1, (5, -0.1), (6, -3.0)), lp(-1.0, (7, -1.0), (9, -1.001))]}
    on = {"a": [lp(-0.1, (5, -0.1), (6, -3.0)), lp(-1.0, (9, -1.0), (7, -1.0004))]}
    d, = compare([("a", [5, 7], "length")], [("a", [5, 9], "length")], off, on, tol=1e-2)
    assert d.near_tie is True and d.gap < 1e-2
    assert d.top2_expected == [(7, -1.0), (9, -1.001)] and d.top2_got[0][0] == 9
    assert "numerical tie" in d.describe()


def test_clear_winner_is_not_a_tie():
    off = {"a": [lp(-0.2, (7, -0.2), (9, -2.5))]}
    on = {"a": [lp(-2.4, (7, -0.3), (9, -2.4))]}  # a race picked token 9 far below token 7
    d, = compare([("a", [7], "length")], [("a", [9], "length")], off, on, tol=1e-2)
    assert d.near_tie is False and d.gap > 2
    assert "clear winner" in d.describe()


def test_token_outside_the_top_k_gives_a_lower_bound():
    off = {"a": [lp(-0.1, (7, -0.1), (1, -4.0), (2, -5.0))]}  # 9 is not in the top list: at most -5
    d, = compare([("a", [7], "length")], [("a", [9], "length")], off, None, tol=1e-2)
    assert d.near_tie is False and d.gap >= 4.9


def test_length_and_finish_differences_are_divergences():
    d, = compare([("a", [1, 2], "length")], [("a", [1, 2, 3], "length")])
    assert d.position == 2 and d.expected == [] and d.got == [3]
    d, = compare([("a", [1, 2], "length")], [("a", [1, 2], "abort")])
    assert d.position == 2 and (d.expected_finish, d.got_finish) == ("length", "abort")
    d, = compare([("a", [1], "length")], [])
    assert d.got_finish == "missing"


def test_report_names_request_position_and_verdict():
    divs = compare([("a", [1, 2], "length"), ("b", [3], "length")], [("a", [1, 4], "length"), ("b", [3], "length")])
    text = report(divs)
    assert "1 request(s) diverge" in text and "request a" in text and "position 1" in text
    assert report([]) == "no divergence"


def test_ref_runs_carry_logprobs_and_a_real_divergence_is_a_clear_winner():
    """penalty_from_cpu changes greedy tokens under overlap: not a tie, it is a bug."""
    t = RefTarget(faults={"penalty_from_cpu"})
    tok = t.tokenizer()
    from harness.engine.request import Request
    reqs = [Request(f"p{i}", [tok.bos_id] + tok.encode("abab abab " * (i + 1)), max_new_tokens=12,
                    repetition_penalty=1.8) for i in range(2)]
    off = t.run(reqs, overlap=False, max_running=2)
    on = t.run(reqs, overlap=True, max_running=2)
    divs = compare_runs(off, on)
    assert divs, "penalty_from_cpu must change tokens under overlap"
    assert all(d.top2_expected and d.top2_got for d in divs)
    assert any(d.near_tie is False for d in divs)


# -- records that belong to their tokens (issue 10, item 6) ---------------------------------
def test_a_record_of_another_token_is_a_race_not_a_tie():
    """The overlap-on record at the divergent position is a stale one (another step's): read as
    if it were token 9's, it shows 7 and 9 within 0.001 nats, a "tie". It is not token 9's
    record (its chosen logprob is token 7's), so the divergence is a race."""
    off = {"a": [lp(-0.2, (7, -0.2), (9, -2.5))]}
    stale = {"a": [lp(-1.0, (7, -1.0), (9, -1.001))]}  # chosen -1.0 is 7's, yet 9 was returned
    d, = compare([("a", [7], "length")], [("a", [9], "length")], None, stale, tol=1e-2)
    assert d.near_tie is False and d.inconsistent and "race" in d.verdict
    d, = compare([("a", [7], "length")], [("a", [9], "length")], off, stale, tol=1e-2)
    assert d.near_tie is False and "overlap on:" in d.inconsistent
    # a record carrying its own token id is checked against it directly
    d, = compare([("a", [7], "length")], [("a", [9], "length")], None, {"a": [(-1.0, [(7, -1.0)], 7)]})
    assert "recorded for token 7" in d.inconsistent


def test_server_records_as_token_dicts():
    """A real engine's record: {token id: logprob} over the top-k plus the chosen token."""
    from harness.oracles.divergence import inconsistency, record_problems
    off = {"a": [{7: -0.2, 9: -2.5}]}
    on = {"a": [{9: -1.0, 7: -1.004}]}
    d, = compare([("a", [7], "length")], [("a", [9], "length")], off, on, tol=1e-2)
    assert d.near_tie is True and d.inconsistent is None and d.top2_got[0] == (9, -1.0)
    assert inconsistency({5: -0.1, 6: -2.0}, 9) and inconsistency({9: -0.1}, 9) is None
    d, = compare([("a", [7], "length")], [("a", [9], "length")], off, {"a": [{7: -1.0, 8: -1.001}]})
    assert d.inconsistent and "no logprob for the returned token 9" in d.inconsistent
    assert record_problems([("a", [9], "length")], {"a": [{7: -1.0}]})
    assert record_problems([("a", [9], "length")], {"a": [{9: -1.0}]}) == []


def test_stale_logprobs_fault_is_a_race_at_the_divergence():
    """Injected: records read from the other step's pinned buffer (stale_logprobs) plus a real
    divergence (penalty_from_cpu). Every divergence is classified as a race, none as a tie; with
    the records right, the same divergences are clear winners."""
    from harness.oracles.divergence import record_problems, run_logprobs
    from harness.engine.request import Request
    t = RefTarget(faults={"penalty_from_cpu", "stale_logprobs"})
    tok = t.tokenizer()
    reqs = [Request(f"p{i}", [tok.bos_id] + tok.encode("abab abab " * (i + 1)), max_new_tokens=12,
                    repetition_penalty=1.8) for i in range(2)]
    off = t.run(reqs, overlap=False, max_running=2)
    on = t.run(reqs, overlap=True, max_running=2)
    divs = compare_runs(off, on)
    assert divs and all(d.inconsistent and d.near_tie is False for d in divs)
    assert "logprob record that is not the returned token's" in report(divs)
    assert record_problems(on.outputs, run_logprobs(on))
    good = RefTarget().run(reqs, overlap=True, max_running=2)
    assert record_problems(good.outputs, run_logprobs(good)) == []
