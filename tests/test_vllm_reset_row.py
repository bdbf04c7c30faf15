"""The spec_reset_in_flight row (issue 43, item 3: a reset with a speculative frame in flight, vllm#46066's
class) without vLLM: its judgement (count, placeholders below 0, tokens, books), its requests resumed whole
by construction, and a death under its own run kept as its CRASH. On the engine it runs in the drafter
configurations' gates (`check --target vllm --configs spec-draft`)."""
from pathlib import Path

import pytest

from equivalence.path_judge import judge
from harness.targets.base import Run
from harness.targets.vllm import paths as vp
from harness.targets.vllm import workload as vllm_workload


def _run(outputs):
    r = Run(outputs)
    r.logprobs = {}
    return r


def _path_run(on_ids, counts, rid="rs0", paths=(vllm_workload.RESET_ROW,)):
    req = vllm_workload.path_request(rid, [1, 2, 3], 4, paths)
    return vp.PathRun([req], _run([(rid, [5, 6, 7, 8], "length")]), _run([(rid, on_ids, "length")]),
                      dict(counts), dict(counts))



def test_the_reset_row_is_judged_on_its_count_tokens_and_books():
    """spec_reset_in_flight (vllm#46066's class): "not exercised" until the agent counted a stale
    frame of rejected drafts met by its request resumed whole (async on; the off arm has no frame in
    flight by design); a divergence of its requests fails it, and so does a leak in its own run's
    books at idle; quiet when all three hold."""
    from tests.test_books import _books
    row = vp.PATHS_BY_NAME[vllm_workload.RESET_ROW]
    assert row.arm == "on" and row.counters == ("spec_stale_drop_resumed",)
    pr = _path_run([5, 6, 7, 8], {}, rid="rs0", paths=(row.name,))
    with pytest.raises(pytest.fail.Exception, match="not exercised: spec_reset_in_flight ran 0 times"):
        judge(row, pr, known=[])
    pr.counts_on = {"spec_stale_drop_resumed": 1}
    pr.books = {True: _books(), False: _books()}
    judge(row, pr, known=[])
    pr.books[True] = _books(requests=1, kv_requests=1, blocks_in_use=1, blocks_free=26)
    with pytest.raises(pytest.fail.Exception, match="spec_reset_in_flight: books: async on: 1 KV blocks"):
        judge(row, pr, known=[])
    pr.books[True] = _books()
    pr.counts_on = {"spec_stale_drop_resumed": 1, "placeholders_below_zero": 2}  # vllm#46066 re-created: measured
    with pytest.raises(pytest.fail.Exception, match=r"async on: 2 running request\(s\) whose output placeholders"):
        judge(row, pr, known=[])
    with pytest.raises(pytest.fail.Exception, match="request rs0 diverges at token 1"):
        judge(row, _path_run([5, 9, 7, 8], {"spec_stale_drop_resumed": 1}, rid="rs0", paths=(row.name,)), known=[])


def test_the_reset_rows_requests_are_resumed_whole_by_construction():
    """The requests the resets meet: greedy (compared on vs off), each with its prompt and every token
    it may produce inside one step's budget, and the first two together (vLLM resumes in FIFO order:
    the first is resumed whole in the schedule right after a reset, whatever the others do); a run
    again has prompts of its own; the row is a drafter's (n/a elsewhere)."""
    from harness.targets.vllm import configs as vc
    tok = _tok()
    for label in (0, 50):
        reqs = vllm_workload.build_resets(tok, label)
        lens = [len(r.prompt_ids) + r.max_new_tokens for r in reqs]
        assert all(r.temperature == 0 and r.paths == {vllm_workload.RESET_ROW} for r in reqs)
        assert max(lens) <= vp.MAX_BATCHED_TOKENS and sum(lens[:2]) <= vp.MAX_BATCHED_TOKENS
    assert {tuple(r.prompt_ids) for r in vllm_workload.build_resets(tok, 0)}.isdisjoint(
        tuple(r.prompt_ids) for r in vllm_workload.build_resets(tok, 50))
    assert len(vllm_workload.RESETS_AT) >= 3  # timing decides which reset meets a frame: several
    assert vc.row_absent(vllm_workload.RESET_ROW, vc.CONFIGS[vc.DEFAULT]).startswith("n/a in configuration")
    assert vc.row_absent(vllm_workload.RESET_ROW, vc.CONFIGS["spec-draft"]) == ""


def _tok():
    from harness.engine.smollm2 import HFTokenizer
    from harness.targets.vllm import setup as vllm_setup
    d = vllm_setup.model_dir(vllm_setup.vllm_home(), "smollm2")
    if not (Path(d) / "tokenizer.json").is_file():
        pytest.skip("needs the SmolLM2 tokenizer (`overlap-harness setup vllm`)")
    return HFTokenizer.from_dir(str(d))


def test_a_death_under_the_reset_rows_run_is_that_rows_crash(monkeypatch):
    """The reset row's run comes before the workload and keeps a death as its own: the fixture
    returns it (the workload's pair starts again), and the row's case ends as a CRASH with the
    engine's line, never as a pass or a death of the workload's first case."""
    from equivalence import test_paths as tp
    from harness.plugin import of_exception
    from harness.targets.base import TargetCrash
    from harness.verdict import Status

    class Dead:
        name, paths, version, runner = "vllm", True, "0.32.0", "v1"

        def row_absent(self, row):
            return ""

        def facts_dir(self, overlap):
            return "/nonexistent"

    def crash(*a, **kw):
        raise TargetCrash("CRASH: vllm (overlap on) exited with code 0: AssertionError: assert "
                          "request.num_output_placeholders >= 0")
    monkeypatch.setattr(vllm_workload, "run_resets", crash)
    fixture = getattr(tp.reset_run, "__wrapped__", None) or tp.reset_run.__pytest_wrapped__.obj  # its function
    pr = fixture(Dead(), _FakeTok())
    assert "num_output_placeholders >= 0" in pr.controls["crash"]
    with pytest.raises(TargetCrash) as e:
        tp.test_path(Dead(), vp.PATHS_BY_NAME[vllm_workload.RESET_ROW], lambda *kv: None,
                     type("R", (), {"getfixturevalue": staticmethod(lambda name: pr)})())
    assert of_exception(e.value)[0] == Status.CRASH


class _FakeTok:
    bos_id, add_bos = 1, False

    def encode(self, text):
        return [ord(c) for c in text]
