"""`sweep`'s short stress per release (issue 44 item 4), without vLLM: the stress summary a real
`stress` writes (search.served.explore.summary_record) read back per release, the table's `stress`
row and notes, the exit code, no stress where the gate could not run, the command line the real
CLI parses, and a stress that could not run said in one line."""
import json
from types import SimpleNamespace

import pytest

from harness.cli import make_parser
from harness.releases import stress as rs
from harness.releases import sweep as sw
from harness.search.served.case import ServedCase
from harness.search.served.explore import Found, ServedStressResult, summary_record


def _summary(out, found=(), known=None, runs=12, cases=40, error="", lines=()):
    res = ServedStressResult(runs=runs, cases=cases, known=dict(known or {}), error=error)
    for kind, what, repro in found:
        res.found.append(Found(SimpleNamespace(kind=kind, summary=what), 30.0, ServedCase([1, 2, 3]), ServedCase([1]),
                               repro=repro))
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary_record(res, list(lines))))


@pytest.mark.parametrize("found,known,runs,error,lines,status", [
    ((), {"async-seeded-preempt-in-flight": [2, "drop on reset"]}, 12, "", (), "pass"),
    ((("divergence", "request r3 diverges at token 5", "out/r.json"),), {}, 12, "", (), "FAIL"),
    ((), {}, 12, "", ("overlap: LOST on prompt_logprobs: 0.0 of steps",), "FAIL"),
    ((), {}, 0, "servers did not start: exit 1", (), "UNAVAILABLE"),
    ((), {}, 0, "", (), "UNAVAILABLE"),
])
def test_a_stress_summary_reads_back_as_its_status_and_findings(tmp_path, found, known, runs, error, lines, status):
    _summary(tmp_path, found, known, runs=runs, error=error, lines=lines)
    r = rs.read_summary(tmp_path, 0, 5.0)
    assert r.status == status
    if found:
        assert r.findings == [{"kind": "divergence", "summary": "request r3 diverges at token 5", "repro": "out/r.json"}]
        assert r.cell() == "FAIL (1 new)"
    if known:
        assert r.known == {"async-seeded-preempt-in-flight": 2}
        assert r.cell() == "pass (40 cases) KNOWN async-seeded-preempt-in-flight"
    if status == "UNAVAILABLE":
        assert r.error and r.cell() == "UNAVAILABLE"


def test_no_summary_is_unavailable_with_the_logs_error_line(tmp_path):
    (tmp_path / "stress.log").write_text("starting\noverlap-harness: error: target vllm: 0.11.0 is not installed\n")
    r = rs.read_summary(tmp_path, 2, 1.0)
    assert r.status == "UNAVAILABLE" and r.error == "overlap-harness: error: target vllm: 0.11.0 is not installed"
    assert rs.read_summary(tmp_path, 124, 1.0).error == "the stress ran past its time limit"


def test_the_stress_command_is_one_the_cli_parses(tmp_path):
    cmd = rs.stress_command("0.28.0", tmp_path / "s", 2.5, 7, ["--vllm-runner", "v2"])
    a = make_parser().parse_args(cmd[3:])  # after `python -m harness.cli`
    assert (a.cmd, a.target, a.vllm_version, a.minutes, a.seed, a.out, a.vllm_runner) == (
        "stress", "vllm", "0.28.0", 2.5, 7, str(tmp_path / "s"), "v2")


def _gate(version, out_dir):
    if version == "0.12.0":
        return sw.ReleaseResult(version, sw.UNAVAILABLE, error="target vllm: venv missing")
    return sw.ReleaseResult(version, "PASS", {"steps": {"status": "pass", "detail": ""}}, seconds=1.0)


def test_the_sweep_runs_the_stress_after_each_gate_that_ran_and_a_new_finding_fails_the_release(tmp_path):
    calls, lines = [], []

    def stress(version, out_dir):
        calls.append(version)
        out = tmp_path / f"{version}-stress"
        if version == "0.11.0":  # an old release: one new finding, kept as a reproducer
            _summary(out, [("divergence", "request r3 diverges at token 5", str(out / "repro-1.json"))])
        else:
            _summary(out, known={"async-step-past-max-tokens": [1, "x"]})
        return rs.read_summary(out, 0, 3.0)

    res = sw.run_sweep(["0.11.0", "0.12.0", "0.32.0"], _gate, tmp_path, progress=lines.append, stress=stress)
    assert calls == ["0.11.0", "0.32.0"]  # none where the gate could not run
    assert "[1/3] vLLM 0.11.0: stress FAIL (1 new) in 3 s" in lines
    t = sw.format_table(res)
    row = next(ln for ln in t.splitlines() if ln.startswith("stress"))
    assert row.split()[1:4] == ["FAIL", "(1", "new)"] and "KNOWN async-step-past-max-tokens" in row
    assert f"0.11.0 stress: FAIL: request r3 diverges at token 5 (reproducer: {tmp_path}/0.11.0-stress/repro-1.json)" in t
    assert sw.exit_code(res) == 1
    assert sw.exit_code([res[2]]) == 0  # known upstream only: the release passes, as the gate counts it
    # the JSON keeps it, and a merge reads it back
    f = tmp_path / "s.json"
    f.write_text(json.dumps(sw.to_json(res)))
    back = sw.load([f])
    assert back[0].stress["findings"][0]["repro"].endswith("repro-1.json") and back[1].stress is None
    assert sw.format_table(back) == t


def test_without_stress_the_table_has_no_stress_row(tmp_path):
    res = sw.run_sweep(["0.32.0"], _gate, tmp_path)
    assert res[0].stress is None and "stress" not in sw.format_table(res)


def test_a_negative_stress_time_is_one_line_exit_2(capsys):
    from harness.cli import main
    assert main(["sweep", "--releases", "installed", "--stress-minutes", "-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--stress-minutes" in err
