"""Draft-model speculative decoding against real vLLM (issue 43), scheduled tier: one pair start and
the path suite per run (about 90 s each here). Its fast representative in .ci/run is
tests/test_vllm_spec.py (the cut model, the agent's window records, the verify rule, the CPU
workaround, the drawn drafter configurations, without a server).

- stock 0.32.0 passes the gate of each drafter's configuration with every speculative row counted
  on both arms (the quiet half): spec-draft (SmolLM2 cut to 3 layers: drafts mostly rejected) and
  spec-same (the target as its own drafter: greedy windows mostly accepted whole), and on V2
  v2-ngram (ngram_gpu, its kernels ours under Triton's interpreter: about 6 minutes here);
- each re-created bug of speculative decoding fails the gate of the drafter that reaches it: the
  draft-aware max_tokens guard (vllm#29542) needs rejected drafts near max_tokens (spec-draft, the
  steps oracle's waits), the placeholder repair of accepted drafts (vllm#30122) needs accepted
  drafts under penalties (spec-same, spec_penalties), a reset's stale frame of rejected drafts
  rolled back onto its request resumed whole (vllm#46066) needs the reset row's short requests
  (spec-draft, spec_reset_in_flight: the placeholders below 0, or vLLM's own assertion: a CRASH).

Needs `overlap-harness setup vllm` (which writes the cut draft model)."""
import pytest

from tests import check_cli

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.scheduled]
SPEC_ROWS = ("spec_windows", "spec_rejection", "spec_in_flight", "spec_penalties", "spec_reset_in_flight")
ON_ONLY = ("spec_in_flight", "spec_reset_in_flight")  # counted async on only, by definition
# each re-created bug, the drafter configuration that reaches it, and what its verdict names
CAUGHT = {"spec_max_tokens_guard_ignores_drafts": ("spec-draft", "with budget free async on"),
          "spec_placeholders_repair_last_only": ("spec-same", "spec_lp_placeholders"),
          # the row's violation, or the engine's assertion where no later step lifted the count first
          "spec_reset_rolls_back_stale_rejections": ("spec-draft", ("placeholders_below_zero",
                                                                    "num_output_placeholders >= 0"))}


def _gate(capsys, tmp_path, *argv):
    code, _, out = check_cli.check(tmp_path, *argv)  # a process of its own: its own pairs, closed at its end
    return code, out


# what each drafter configuration's verdict names as its CPU adaptation
ADAPTED = {"spec-draft": "vllm#55005", "spec-same": "vllm#55005", "v2-ngram": "n-gram drafter's two Triton kernels"}


@pytest.mark.parametrize("config", sorted(ADAPTED))
def test_stock_drafter_gate_is_quiet_with_every_speculative_row_counted(config, capsys, tmp_path):
    code, out = _gate(capsys, tmp_path, "--configs", config)
    assert code == 0, out[-3000:]
    line = next(x for x in out.splitlines() if x.startswith("paths exercised"))
    for row in SPEC_ROWS:  # counted on both arms (ON_ONLY: async on only, by definition)
        on, off = line.split(f"{row} ")[1].split(",")[0].split("/")
        assert int(on) > 0 and (row in ON_ONLY or int(off) > 0), (row, line)
    assert "speculative windows: async on" in out and "accepted lengths" in out
    assert ADAPTED[config] in out  # the CPU adaptation the verdict names


@pytest.mark.parametrize("patch", sorted(CAUGHT))
def test_each_spec_bug_fails_the_gate_of_the_drafter_that_reaches_it(patch, capsys, tmp_path):
    import json
    config, said = CAUGHT[patch]
    code, out = _gate(capsys, tmp_path, "--configs", config, "--fault", patch, "--json", str(tmp_path / "g.json"))
    cases = json.loads((tmp_path / f"g-{config}.json").read_text())["cases"]
    said = (said,) if isinstance(said, str) else said
    ends = ("FAIL", "CRASH") if len(said) > 1 else ("FAIL",)  # the reset's: a violation or the engine's death
    assert code == 1 and any(c["status"] in ends and any(w in c["detail"] for w in said)
                             for c in cases), out[-3000:]
