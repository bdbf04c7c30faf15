"""Server configurations as a dimension (harness.targets.vllm.configs; issue 36, item 1), without a
server: the catalogue and its doc, the flags each configuration gives the servers, the rows it
takes away, stress drawing one configuration per segment of runs (its summary and reproducers),
and one-line errors for names that do not exist. The servers of each configuration are started in
benchmarks/bench_vllm_configs.py and in the scheduled matrix (tests/test_vllm_configs_served.py)."""
import json
from pathlib import Path

import pytest

from harness.search.served import repro as served_repro
from harness.search.served.judge import Finding, Verdict
from harness.targets.vllm import configs as vc
from harness.targets.vllm import paths as vp

ROOT = Path(__file__).resolve().parent.parent


def test_the_catalogue_is_the_doc_and_names_what_each_could_expose():
    assert vc.DEFAULT in vc.CONFIGS and vc.MATRIX[0] == vc.DEFAULT
    assert all(c.exposes for c in vc.CONFIGS.values())
    assert all(r in vp.PATHS_BY_NAME for c in vc.CONFIGS.values() for r in c.hides)
    assert [n for n, c in vc.CONFIGS.items() if c.refused] == ["uni-executor", "pp2-v1", "pp3-v1"]
    assert vc.matrix_markdown() in (ROOT / "docs/vllm-configs.md").read_text()
    # what the issue asks for is there: batches of 1 and 2, both budgets, chunked prefill off,
    # a block size, pressure and none, prefix caching off, the executor, the priority policy
    flags = " ".join(c.flags() for c in vc.CONFIGS.values())
    for need in ("--max-num-seqs 1", "--max-num-seqs 2", "--max-num-batched-tokens 32", "--no-enable-chunked-prefill",
                 "--block-size 64", "--no-enable-prefix-caching", "VLLM_ENABLE_V1_MULTIPROCESSING=0",
                 "--scheduling-policy priority", "--num-gpu-blocks-override 1024", "--num-gpu-blocks-override 17"):
        assert need in flags, need


def test_every_setting_a_configuration_lifts_is_in_the_settings_table():
    """SETTINGS (docs/vllm-paths.md) names, for what each setting could hide, the configurations
    that run without it; every configuration but the default is named by one."""
    named = {n.split(" ")[0] for st in vp.SETTINGS for n in st.configs.split(", ") if n}
    assert named <= set(vc.CONFIGS)
    assert set(vc.MATRIX) - {vc.DEFAULT} <= named


@pytest.mark.parametrize("name", list(vc.CONFIGS))
def test_a_configuration_replaces_the_path_settings_flags(name):
    c = vc.CONFIGS[name]
    base = ["--max-num-seqs", "32", "--async-scheduling", *vp.SERVER_ARGS]
    got = vc.apply(base, c)
    keys = [k for k, _ in vc._split(got)]
    assert len(keys) == len(set(keys)), got  # each flag once: the configuration's wins, never a duplicate
    assert " ".join(c.args) in " ".join(got)
    mine = {k for k, _ in vc._split(c.args)} | set(c.drop)
    kept = [toks for k, toks in vc._split(base) if k not in mine]
    assert all(" ".join(t) in " ".join(got) for t in kept)  # the rest of the path setting stays
    assert not set(c.drop) & set(keys)  # a flag the configuration drops is gone (with its values)


def test_the_target_gives_the_servers_its_configuration():
    from harness.targets.vllm import releases as vllm_releases
    from harness.targets.vllm.target import VllmTarget
    t = VllmTarget.__new__(VllmTarget)
    t.python, t.model_path, t.dtype, t.seed, t.max_model_len, t.max_num_seqs = "py", "m", "float32", 0, 512, 32
    t.kv_cache_bytes, t.extra_args, t.paths, t.pair = 1 << 20, [], True, "main"
    t.release = vllm_releases.release(vllm_releases.PINNED)
    assert " ".join(t.server_command(True, 1)).count("--max-num-seqs 32") == 1  # the default: today's
    t.config = vc.CONFIGS["one-seq"]
    cmd = " ".join(t.server_command(True, 1))
    assert "--max-num-seqs 1" in cmd and "--max-num-seqs 32" not in cmd
    t.config, t.home = vc.CONFIGS["spec-draft"], Path("/h")  # a drafter: its flag, no CLI logits processor
    cmd = t.server_command(True, 1)
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "model": "/h/models/smollm2-135m-draft-3l", "num_speculative_tokens": 3}
    t.config = vc.CONFIGS["spec-same"]  # the target as its own drafter
    cmd = t.server_command(True, 1)
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["model"] == "m"
    assert "--logits-processors" not in cmd and "--enable-prefix-caching" in cmd
    t.config = vc.CONFIGS["priority"]
    from harness.engine.request import Request
    r = Request(rid="c0r0", prompt_ids=[1, 2], max_new_tokens=3)
    r.extra, r.n, r.priority = {}, 1, 2
    t.model_path = "m"
    assert t.payload(r, True)["priority"] == 2


def test_rows_a_configuration_cannot_reach_are_na_never_a_pass():
    assert all(vc.row_absent(r.name, vc.CONFIGS[vc.DEFAULT]) == "" for r in vp.PATHS if r.name not in vc.SPEC_ROWS)
    # the speculative rows: only a drafter's configuration reaches them, and it loses the processors' rows
    assert set(vc.SPEC_ROWS) <= set(vp.PATHS_BY_NAME)
    for row in vc.SPEC_ROWS:
        assert vc.row_absent(row, vc.CONFIGS[vc.DEFAULT]).startswith(f"n/a in configuration default: {row}: no drafter")
        assert vc.row_absent(row, vc.CONFIGS["spec-draft"]) == ""
    assert "logits processor" in vc.row_absent("logits_processor_cli", vc.CONFIGS["spec-draft"])
    assert vc.row_absent("penalties", vc.CONFIGS["spec-draft"]) == ""
    why = vc.row_absent("preemption_in_flight", vc.CONFIGS["kv-plenty"])
    assert why.startswith("n/a in configuration kv-plenty: preemption_in_flight")
    assert vc.row_absent("prefix_cache_hit", vc.CONFIGS["no-prefix-cache"])
    assert vc.row_absent("chunked_prefill", vc.CONFIGS["whole-prefill"])
    assert vc.row_absent("bad_words_bare", vc.CONFIGS["priority"])  # the bare pair: default only
    assert vc.row_absent("preemption_in_flight", vc.CONFIGS["priority"]) == ""  # what its patch needs


def test_names_parse_pin_exclude_and_refuse_in_one_line():
    assert vc.parse(None) == [vc.DEFAULT] and vc.parse("all") == vc.MATRIX
    assert vc.parse("priority,one-seq") == ["priority", "one-seq"]
    assert vc.parse("-priority") == vc.parse("all,-priority") == [n for n in vc.MATRIX if n != "priority"]
    with pytest.raises(ValueError, match="after all, only exclusions"):
        vc.parse("all,priority")
    with pytest.raises(ValueError, match="unknown server configuration 'nope'; known: default"):
        vc.parse("default,nope")
    with pytest.raises(ValueError, match="uni-executor cannot run"):
        vc.parse("uni-executor")


@pytest.mark.parametrize("argv,msg", [
    (["stress", "--target", "vllm", "--configs", "nope"], "unknown server configuration 'nope'"),
    (["stress", "--target", "vllm", "--configs", "uni-executor"], "cannot run on vLLM's CPU build"),
    (["stress", "--target", "vllm", "--config-minutes", "0"], "--config-minutes must be a positive number"),
    (["stress", "--configs", "one-seq"], "--configs applies to a served target"),
    (["stress", "--target", "openai", "--url", "a", "--url-off", "b", "--configs", "one-seq"],
     "--configs applies to --target vllm or sglang only"),
    (["check", "--target", "vllm", "--configs", "nope"], "unknown server configuration 'nope'"),
    (["check", "--configs", "all"], "--configs applies to --target vllm or sglang"),
])
def test_bad_configuration_flags_are_one_line_and_exit_2(argv, msg, capsys, tmp_path):
    from harness.cli import main
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert msg in err[-1] and not any("starting" in e for e in err), err


def test_stress_visits_the_default_first_then_an_order_drawn_from_the_seed():
    from types import SimpleNamespace
    from harness.commands.stress_served import config_order

    def bad(m):
        return ValueError(m)
    a = SimpleNamespace(target="vllm", configs=None, seed=3)
    order = config_order(a, bad)
    assert order[0] == vc.DEFAULT and sorted(order) == sorted(vc.MATRIX)
    assert order == config_order(SimpleNamespace(target="vllm", configs=None, seed=3), bad)
    assert order != config_order(SimpleNamespace(target="vllm", configs=None, seed=4), bad)
    assert config_order(SimpleNamespace(target="vllm", configs="priority,one-seq", seed=3), bad) == ["priority", "one-seq"]
    assert "priority" not in config_order(SimpleNamespace(target="vllm", configs="all,-priority", seed=3), bad)
    from harness.cli import main  # argparse takes the exclusion as a value (not as an option)
    assert main(["stress", "--target", "vllm", "--configs", "all,-nope", "--minutes", "1"]) == 2


class _Cfg:
    def __init__(self, name):
        self.name, self.config = "vllm", vc.CONFIGS[name]
        self.seed = 0

    def url(self, overlap):
        return "http://x"

    def payload(self, r, overlap):  # what the real target sends, in this configuration
        from harness.targets.vllm import releases as vllm_releases
        from harness.targets.vllm.target import VllmTarget
        t = VllmTarget.__new__(VllmTarget)
        t.config, t.model_path, t.seed = self.config, "m", 0
        t.release = vllm_releases.release(vllm_releases.PINNED)
        return t.payload(r, overlap)

    def model_name(self):
        return "m"


def _tok():
    from harness.targets.vllm import setup as vllm_setup
    from harness.engine.smollm2 import HFTokenizer
    d = vllm_setup.model_dir(vllm_setup.vllm_home(), "smollm2")
    if not (Path(d) / "tokenizer.json").is_file():
        pytest.skip("needs the SmolLM2 tokenizer (`overlap-harness setup vllm`)")
    return HFTokenizer.from_dir(str(d))


def test_stress_draws_a_configuration_per_segment_and_counts_cases_in_each(tmp_path, monkeypatch):
    """Segments of runs, one configuration each, the pair switched between them (never per case);
    a configuration whose servers do not start is said in one line and the search goes on; the
    summary has cases per configuration; under the priority policy the requests carry a priority."""
    from harness.search.served import explore as ss
    from harness.targets.base import TargetUnavailable
    clock = [0.0]
    monkeypatch.setattr(ss.time, "monotonic", lambda: clock[0])
    switched, seen = [], {}

    def switch(name):
        switched.append(name)
        clock[0] += 50.0  # a pair's start: not search time
        if name == "kv-tight":
            raise TargetUnavailable("vllm server (overlap off) exited with code 1: boom")
        return _Cfg(name)

    class Judged(ss.ServedStress):
        def judge(self, c):
            clock[0] += 10.0  # one run: 10 s
            seen.setdefault(self.t.config.name, []).append(c)
            return Verdict()
    s = Judged(_Cfg("default"), _tok(), seconds=500, out=str(tmp_path), shrink_seconds=0, agent=False,
               configs=["default", "kv-tight", "priority", "one-seq"], switch=switch, segment_seconds=100)
    res = s.run()
    assert switched[:3] == ["kv-tight", "priority", "one-seq"]  # one start per segment, never per case
    assert res.config_errors == {"kv-tight": "vllm server (overlap off) exited with code 1: boom"}
    assert set(res.configs) == {"default", "priority", "one-seq"}
    assert all(c["runs"] >= 5 and c["segments"] >= 1 for c in res.configs.values())  # ~10 runs a segment
    assert sum(c["cases"] for c in res.configs.values()) == res.cases
    assert res.start_s >= 150 and res.explore_s <= 500 - 150
    assert any(getattr(r, "priority", 0) for c in seen["priority"] for r in c.requests)
    assert not any(hasattr(r, "priority") for c in seen["default"] for r in c.requests)
    lines = ss.summary_lines(s)
    assert any(x.startswith("server configurations (cases") and "priority" in x and "one-seq" in x for x in lines)
    assert "configuration kv-tight: its servers did not start: vllm server (overlap off) exited" in "\n".join(lines)


def test_a_reproducer_records_its_configuration_and_an_old_one_runs_the_default(tmp_path, capsys):
    from harness.search.served.case import ServedCase
    from harness.engine.request import Request
    r = Request(rid="c0r0", prompt_ids=[5, 6, 7], max_new_tokens=4)
    r.extra, r.n, r.priority = {}, 1, 3
    t = _Cfg("priority")
    d = served_repro.reproducer(t, ServedCase([r]), Finding("divergence", "d", ("divergence",)), seed=1)
    assert d["harness"]["config"] == "priority" and d["requests"][0]["priority"] == 3
    _, back = served_repro.load(served_repro.write(str(tmp_path / "r.json"), d))
    assert back.requests[0].priority == 3 and t.payload(back.requests[0], True)["priority"] == 3
    # a reproducer written before configurations existed: no "config", the default's servers
    del d["harness"]["config"]
    d["harness"]["patches"] = ["no_such_patch"]  # stops the replay at the flag check, before any server
    old = served_repro.write(str(tmp_path / "old.json"), d)
    from harness.cli import main
    assert main(["replay", old, "--target", "vllm"]) == 2
    assert "server configuration default," in capsys.readouterr().err
    d["harness"]["config"], d["harness"]["patches"] = "nope", []
    bad = served_repro.write(str(tmp_path / "bad.json"), d)
    assert main(["replay", bad, "--target", "vllm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "names server configuration 'nope'; known: default" in err[0], err


def test_the_priority_patch_edits_only_the_priority_branch():
    """The proof patch of issue 36, item 1 lives in code the default configuration never runs:
    both of its edits sit under `self.policy == SchedulingPolicy.PRIORITY`."""
    from harness.agents.vllm.patches import PATCHES
    p = PATCHES["priority_victim_keeps_placeholders"]
    assert p.path == "preemption_in_flight" and vc.row_absent(p.path, vc.CONFIGS["priority"]) == ""
    for _, replace in p.edits:
        assert "victim_placeholders" in replace
    assert "if self.policy == SchedulingPolicy.PRIORITY:\n                        preempted_req.num_output_placeholders" \
        in p.also[0][1]


def test_the_gate_reports_on_the_pair_of_the_configuration_that_ran():
    """The verdict's overlap, books, HANG and CRASH lines read the pair the suites used: in the
    matrix, that configuration's (measured: without this, the priority row printed none of them)."""
    from harness import targets
    pairs, sentinel = targets.Pairs({"vllm": targets.ServedOptions(config="priority")}), object()
    pairs._pairs[targets.served_key("vllm", {"config": "priority"})] = sentinel
    assert pairs.pair("vllm") is sentinel
    assert targets.Pairs({"vllm": targets.ServedOptions()}).pair("vllm") is None


def test_after_a_known_crash_no_request_sets_off_the_pair_starts_where_it_never_comes():
    """Issue 36, item 6: on 0.11.0 vllm#26385 kills the async-on engine whenever a request is
    resumed after preemption or left out of a step, which the path workload does by design, so
    its rows were CRASH twice over. Once that death is seen, the pair starts again in the
    configurations the catalogue names for it (a pool never short, whole prompts); the rows they
    take away say so and why; a release where it is not live keeps its configuration."""
    from harness.targets.vllm import upstream as vllm_upstream
    assert vllm_upstream.crash_remedy("vllm#26385", "0.11.0") == ((), ("kv-plenty", "whole-prefill"))
    assert vllm_upstream.crash_remedy("vllm#26385", "0.11.1") == ((), ())
    assert [f for f, _ in vllm_upstream.crash_remedy("vllm#26467", "0.11.0")[0]] == [
        "repetition_penalty", "frequency_penalty", "presence_penalty"]
    base = vc.CONFIGS[vc.DEFAULT]
    remedy = lambda kid: vllm_upstream.crash_remedy(kid, "0.11.0")  # noqa: E731
    assert vc.after_known_crashes(base, {}, remedy) is base
    assert vc.after_known_crashes(base, {"vllm#26467": ("case p", ())}, remedy) is base  # a trigger, no configuration
    got = vc.after_known_crashes(base, {"vllm#26385": ("equivalence/test_paths.py::test_steps", ())}, remedy)
    assert got.name == "kv-plenty+whole-prefill"
    flags = vc.apply(["--num-gpu-blocks-override", "28", "--max-num-batched-tokens", "64"], got)
    assert flags == ["--num-gpu-blocks-override", "1024", "--max-num-batched-tokens", "2048",
                     "--no-enable-chunked-prefill"], flags
    why = vc.row_absent("preemption", got)
    assert why.startswith("n/a in configuration kv-plenty+whole-prefill: preemption: ") and \
        "KNOWN UPSTREAM vllm#26385 killed its async-on engine in equivalence/test_paths.py::test_steps" in why
    assert vc.row_absent("seeded_partial_prefill", got) and not vc.row_absent("penalties", got)
    assert vc.after_known_crashes(got, {"vllm#26385": ("x", ())}, remedy) is got  # already there
    assert vc.after_known_crashes(base, {"vllm#26385": ("x", ())},
                                  lambda kid: vllm_upstream.crash_remedy(kid, "0.32.0")) is base
