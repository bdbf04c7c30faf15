"""Every parameter had an effect (issue 36, item 3; harness.oracles.effects), without vLLM: the
copies made of the path workload, and a row judged `not exercised` when its parameter changed no
output (the injected fault: a dead parameter), exercised when it changed one (the quiet half).
Against real vLLM the path rows judge it on every run (equivalence/test_paths.py)."""
from types import SimpleNamespace

from harness.oracles import effects
from harness.targets.vllm import workload as vllm_workload


class _Tok:
    bos_id, add_bos = 1, False

    def encode(self, s):
        return [sum(map(ord, w)) % 1000 + 2 for w in s.split()] or [5]


def _run(outputs):
    return SimpleNamespace(outputs=[(rid, ids, "length") for rid, ids in outputs])


def test_copies_cover_each_rows_parameters_and_leave_aborts_out():
    reqs = vllm_workload.build(_Tok(), 0)
    got = {c.rid for c in effects.copies(reqs)}
    for rid in ("pen0~no-repetition_penalty", "pen2~no-presence_penalty", "bw1~no-bad_words", "mt0~no-min_tokens",
                "lb0~no-logit_bias", "st1~no-stop", "st0~no-stop_token_ids", "so0~no-structured_outputs"):
        assert rid in got, rid
    assert not [r for r in got if r.startswith("ab")]  # aborted clients: cut by the client
    c = next(c for c in effects.copies(reqs) if c.rid == "pen0~no-repetition_penalty")
    assert "repetition_penalty" not in c.extra and c.extra["frequency_penalty"] == 0.6


def test_a_dead_parameter_is_not_exercised():
    r = vllm_workload._req("pen9", [5, 6, 7], 4, ["penalties"], presence_penalty=1.5)
    off = _run([("pen9", [1, 2, 3, 4])])
    dead = effects.effects(off, _run([("pen9~no-presence_penalty", [1, 2, 3, 4])]))
    ok, line = effects.row_verdict("penalties", [r], dead)
    assert ok is False and line.startswith("not exercised: penalties: presence_penalty changed no output of pen9"), line
    live = effects.effects(off, _run([("pen9~no-presence_penalty", [1, 2, 9, 9])]))
    ok, line = effects.row_verdict("penalties", [r], live)
    assert ok is True and "presence_penalty 1/1" in line, line
    assert effects.row_verdict("abort", [r], live) == (None, "")  # a row with no parameter of its own


def test_n_samples_are_compared_sample_by_sample():
    off = _run([("n0#0", [1, 2]), ("n0#1", [3, 4])])
    same = _run([("n0~no-logit_bias#0", [1, 2]), ("n0~no-logit_bias#1", [3, 4])])
    assert effects.effects(off, same) == {("n0", "logit_bias"): False}
    other = _run([("n0~no-logit_bias#0", [1, 2]), ("n0~no-logit_bias#1", [3, 5])])
    assert effects.effects(off, other) == {("n0", "logit_bias"): True}
