"""The drafter configuration of the SGLang target (`check --target sglang --configs ngram`):
its flags on both servers, no CPU graph runner (SGLang's refuses a drafter), the verdict naming the
drafter and each CPU adaptation, and a bad name refused in one line."""
from __future__ import annotations

import pytest

from harness.targets.sglang import spec as sglang_spec
from harness.targets.sglang.target import SglangTarget


def make(tmp_path, **kw):
    kw.setdefault("device", "cpu")
    return SglangTarget(model="/models/m", check_env=False, workdir=str(tmp_path), **kw)


def test_ngram_flags_on_both_arms_and_no_cpu_graphs(tmp_path):
    t = make(tmp_path, config="ngram")
    for overlap in (True, False):
        cmd = t.server_command(overlap, 1234)
        i = cmd.index("--speculative-algorithm")
        assert cmd[i + 1] == "NGRAM" and "--speculative-num-draft-tokens" in cmd
        assert "--enable-torch-compile" not in cmd
        assert ("--disable-overlap-schedule" in cmd) is (not overlap)
    assert t.spec is sglang_spec.CONFIGS["ngram"]


def test_no_config_is_the_plain_pair(tmp_path):
    t = make(tmp_path)
    assert t.spec is None and "--speculative-algorithm" not in t.server_command(True, 1)


def test_the_verdict_names_the_drafter_and_the_cpu_adaptations(tmp_path, monkeypatch):
    t = make(tmp_path, config="ngram")
    monkeypatch.setattr(type(t).__mro__[1], "overlap_summary", lambda self: "overlap: EFFECTIVE")
    line = t.overlap_summary()
    assert "drafter: NGRAM" in line and "CPU adaptations: overlap kept on" in line
    assert "_disable_overlap_schedule_for_cpu" in line and "target-verify" in line
    # the accepted lengths of each arm, from the scheduler's facts
    import json
    d = t.facts_dir(True)
    d.mkdir(parents=True, exist_ok=True)
    (d / "sglang-scheduler-1.json").write_text(json.dumps({
        "role": "sglang-scheduler", "pid": 1, "spec_verify_steps": 2, "spec_drafts_proposed": 12,
        "spec_drafts_accepted": 3, "path_spec_reservation": 4, "spec_accept_hist": {"1": 2, "2": 1, "3": 1}}))
    line = t.overlap_summary()
    assert "acceptance (overlap on): 3 of 12 drafts accepted (25%)" in line
    assert "accept lengths {1: 2, 2: 1, 3: 1}" in line and "acceptance (overlap off): no draft proposed" in line


def test_unknown_config_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="unknown SGLang server configuration 'eagle'; known: ngram, ngram-chain"):
        make(tmp_path, config="eagle")
    with pytest.raises(SystemExit):
        sglang_spec.parse("bogus", lambda m: SystemExit(m))
    assert sglang_spec.parse("all", ValueError) == ["ngram", "ngram-chain", "ngram-wide"]


def test_mutants_list_the_spec_patches_with_the_command_that_runs_them(monkeypatch):
    from harness.gate import matrix
    ran = []
    monkeypatch.setattr(matrix, "run_suites", lambda *a, **k: ran.append(a[1]) or
                        type("R", (), {"interrupted": False, "suites": {}})())
    m = matrix.kill_matrix(faults=["sglang_spec_bonus_stride", "sglang_spec_reservation_one_window"], target="sglang")
    assert ran == [()]  # only the correct engine: neither patch runs on the plain pair
    assert m["not_here"]["sglang_spec_bonus_stride"] == ("needs the ngram configuration: check --target sglang "
                                                         "--configs ngram --fault sglang_spec_bonus_stride")


def test_stress_draws_the_drafters_as_configurations():
    """stress --target sglang --configs: default and each drafter's shape (window, tree breadth), one
    pair a segment; a name it does not know is one line."""
    from types import SimpleNamespace as NS
    from harness.commands.stress_served import config_order

    class Bad(Exception):
        pass
    names = config_order(NS(target="sglang", configs="all", seed=3), Bad)
    assert names[0] == "default" and sorted(names[1:]) == sorted(n for n, c in sglang_spec.CONFIGS.items()
                                                                  if sglang_spec.runs_in_all(c))
    assert config_order(NS(target="sglang", configs="ngram,ngram-chain", seed=0), Bad) == ["ngram", "ngram-chain"]
    assert config_order(NS(target="sglang", configs="all,-default", seed=0), Bad)[0] != "default"
    assert config_order(NS(target="sglang", configs=None, seed=0), Bad) == []
    with pytest.raises(Bad, match="unknown SGLang server configuration 'eagle'; known: default, ngram"):
        config_order(NS(target="sglang", configs="ngram,eagle", seed=0), Bad)
    chain = sglang_spec.CONFIGS["ngram-chain"]
    assert "--speculative-num-draft-tokens 3 --speculative-ngram-max-bfs-breadth 1" in chain.flags()


def test_a_fired_judgement_is_a_stress_finding():
    lines = sglang_spec.violation_lines({"spec_past_reservation": 3, "spec_bonus_wrong": 0}, {"spec_relay_len_wrong": 1})
    assert [c for c, _ in lines] == ["spec_past_reservation", "spec_relay_len_wrong"]
    assert lines[0][1].startswith("overlap on: 3 verify windows running past")
    assert sglang_spec.violation_lines({}, {}) == []


def test_stress_on_sglang_claims_the_known_penalty_divergence_only_with_its_mechanism():
    """A drafter's penalised requests diverge on stock (sglang-penalty-one-step-old): stress on SGLang
    reports it KNOWN where the agent counted the stale penalty token for that request, new where not."""
    from types import SimpleNamespace as NS
    from harness.agents.vllm.steps import request_key
    from harness.engine.request import Request
    from harness.search.served.judge import Finding, Verdict, claim_sglang
    r = Request(rid="c0r0", prompt_ids=[1, 2, 3], max_new_tokens=8)
    key = request_key(r.prompt_ids, 8)
    for stale, known in ((2, True), (0, False)):
        v = Verdict()
        v.new = [Finding("divergence", "request c0r0 diverges at token 3 (clear winner): off [1] vs on [2]",
                         ("divergence",), "divergence", "c0r0")]
        run = NS(summary={"facts": [{"penalty_stale_by_req": {key: stale}}], "facts_before": []})
        claim_sglang(v, NS(requests=[r]), run)
        assert (len(v.known), len(v.new)) == ((1, 0) if known else (0, 1))
        if known:
            assert v.known[0][0] == "sglang-penalty-one-step-old"
    # a drafter's judgement that is a known stock bug (its counter is its evidence): claimed too
    from harness.targets.sglang.spec import violation_lines
    v = Verdict()
    v.counts_on = {"spec_context_twice": 2}
    v.new = [Finding("spec", line, ("spec", c), c) for c, line in violation_lines(v.counts_on, {})]
    claim_sglang(v, NS(requests=[r]), NS(summary={}))
    assert not v.new and v.known[0][0] == "sglang-ngram-context-twice"


def test_the_context_twice_entry_claims_only_its_own_counter():
    """sglang-ngram-context-twice (stock 0.5.23, reported by us) claims the spec_draft_context row's
    finding by its code, with the agent's counter above 0; another counter's finding stays new."""
    import os
    from harness.targets.sglang import upstream as sglang_upstream
    from harness.targets.vllm.upstream import classify
    from harness.verdict import Finding
    entry = next(k for k in sglang_upstream.KNOWN if k.id == "sglang-ngram-context-twice")
    assert os.path.isfile(entry.reproducer)
    f = Finding("async on: 3 windows drafted from a context holding ... (spec_context_twice)", "spec_context_twice")
    new, seen, _ = classify("spec_draft_context", [f], known=sglang_upstream.KNOWN, counts={"spec_context_twice": 3})
    assert not new and seen[0][0] == "sglang-ngram-context-twice"
    g = Finding("async on: 1 windows writing their drafts' K/V ... (spec_window_slots_wrong)", "spec_window_slots_wrong")
    new, seen, _ = classify("spec_draft_context", [g], known=sglang_upstream.KNOWN, counts={"spec_context_twice": 3})
    assert new == [g] and not seen


def test_stress_leaves_out_the_divergence_of_a_request_sglang_cannot_seed():
    """Found by stress on the ngram pair (09:03): a temperature-1 request diverged at token 0 (its
    prefill sample: SGLang samples unseeded here, and verifies greedily on a CPU after it). Not a
    finding; a greedy request's divergence still is."""
    from types import SimpleNamespace as NS
    from harness.engine.request import Request
    from harness.search.served.judge import Finding, drop_unjudged
    hot, cold = Request(rid="c1r0", prompt_ids=[1], max_new_tokens=1), Request(rid="c1r1", prompt_ids=[2], max_new_tokens=1)
    hot.temperature, cold.temperature = 1.0, 0.0
    target = NS(unseeded_sampling="SGLang samples unseeded here", name="sglang")
    found = [Finding("divergence", f"request {r} diverges at token 0", ("divergence",), "divergence", r) for r in ("c1r0", "c1r1")]
    left = drop_unjudged(target, NS(requests=[hot, cold]), found)
    assert [f.rid for f in left] == ["c1r1"]
    assert len(drop_unjudged(NS(unseeded_sampling=""), NS(requests=[hot, cold]), found)) == 2


class _NoRun:
    """The gate's `request` where a row must not need the pair's run (its verdict comes first)."""
    def getfixturevalue(self, name):
        raise AssertionError(f"the row asked for {name}: a row with no path here needs no run")


class _Run:
    def __init__(self, pr):
        self.pr = pr

    def getfixturevalue(self, name):
        assert name == "sglang_path_run"
        return self.pr


def _verdict(target, row_name, request):
    """The status, finding code and line the gate's SGLang path case ends with (verdict data)."""
    from equivalence.test_paths import test_sglang_path
    from harness.verdict import outcome
    row = next(r for r in sglang_spec.SPEC_ROWS if r.name == row_name)
    try:
        test_sglang_path(target, row, lambda k, v: None, request)
    except BaseException as exc:  # noqa: BLE001 - a verdict is an exception (harness.verdict.outcome)
        v = outcome.verdict_of(exc)
        assert v is not None, exc
        return v[0], v[1], str(exc)
    return "pass", "", ""


@pytest.mark.parametrize("config", [None, "tp2"])
def test_a_drafters_rows_read_na_where_the_pair_has_no_drafter(tmp_path, config):
    """The default pair (and tp2) runs no drafter: every speculative row is n/a with one line, listed
    apart by the gate (code row.absent), never `not exercised`; the plain rows stay judged."""
    from harness.verdict import Status
    t = make(tmp_path, **({"config": config} if config else {}))
    for name in sglang_spec.SPEC_ROW_NAMES:
        status, code, line = _verdict(t, name, _NoRun())
        assert (status, code) == (Status.NA, "row.absent"), (name, status, line)
        assert line.count("\n") == 0 and f"n/a in configuration {config or 'default'}: {name}: no drafter" in line
    assert sglang_spec.row_absent("relay_decode", None) == ""
    assert sglang_spec.row_absent("spec_verify", sglang_spec.CONFIGS["ngram"]) == ""


@pytest.mark.parametrize("row_name", ["spec_verify", "spec_reservation", "spec_relay_tokens"])
def test_a_configured_drafter_whose_path_never_ran_is_not_exercised(tmp_path, row_name):
    """With a drafter configured the same rows are judged: a path the run never counted (0 windows on
    an arm) fails as `not exercised`, not n/a and never a pass; counted, the row passes."""
    from harness.targets.vllm import paths as vp
    from harness.verdict import Status
    t = make(tmp_path, config="ngram")
    row = next(r for r in sglang_spec.SPEC_ROWS if r.name == row_name)
    never = vp.PathRun([], None, None, {}, {})
    status, code, line = _verdict(t, row_name, _Run(never))
    assert (status, code) == (Status.NOT_EXERCISED, "path.not_run"), line
    assert f"{row_name} ran 0 times (async on" in line
    from harness.targets.base import Run
    from harness.targets.vllm import workload as vllm_workload
    req = vllm_workload.path_request("s0", [1, 2, 3], 4, [row_name])
    arms = [Run([("s0", [5, 6, 7, 8], "length")]) for _ in range(2)]
    for r in arms:
        r.logprobs = {}
    ran = {k: 5 for k in row.counters}
    assert _verdict(t, row_name, _Run(vp.PathRun([req], arms[0], arms[1], dict(ran), dict(ran))))[0] == "pass"


def test_standalone_is_refused_on_a_cpu_in_one_line_from_the_code(tmp_path):
    """A draft model (STANDALONE) cannot start on this CPU (measured: the scheduler dies at init in
    DraftBackendFactory): the configuration says so in one line naming SGLang's file and function,
    before any server starts; `all` leaves it out (it runs only when named, on a GPU)."""
    from harness.targets.base import TargetUnavailable
    with pytest.raises(TargetUnavailable) as e:
        make(tmp_path, config="standalone")
    line = str(e.value)
    assert "\n" not in line and "cannot run on a CPU" in line
    assert "speculative/draft_utils.py:64 DraftBackendFactory._create_backend" in line and "gpu-check.sh" in line
    assert "standalone" not in sglang_spec.parse("all", ValueError)
    assert "standalone" not in sglang_spec.stress_order("all", ValueError)
    assert sglang_spec.parse("standalone", ValueError) == ["standalone"]


def test_standalone_on_a_gpu_drafts_with_the_served_model_and_says_what_the_agent_skips(tmp_path):
    """On a GPU: the served model's own path as the draft model, on both servers; the speculative rows,
    which the agent counts for NGRAM's worker only, read `not exercised` with that reason (a declared
    limit, reported apart), never n/a and never a pass."""
    from harness.verdict import Status
    t = make(tmp_path, config="standalone", device="cuda")
    for overlap in (True, False):
        cmd = t.server_command(overlap, 1234)
        assert cmd[cmd.index("--speculative-algorithm") + 1] == "STANDALONE"
        assert cmd[cmd.index("--speculative-draft-model-path") + 1] == t.model == "/models/m"
        assert sglang_spec.TARGET_MODEL not in cmd
    status, code, line = _verdict(t, "spec_verify", _NoRun())
    assert (status, code) == (Status.NOT_EXERCISED, "drafter_absent") and "NGRAMWorker" in line
