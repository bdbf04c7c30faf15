"""The vLLM source patches (harness.agents.vllm.patches) against the installed vLLM, without
starting it: every patch applies exactly once and compiles, the private copy changes only the
patched files and never the install, and a patch whose text is gone is one clear error.
Which suite catches each patch is tests/test_vllm.py's and `mutants --target vllm`'s job."""
import os

import pytest

from harness.targets.vllm import setup as setup_cmd
from harness.agents.source_patch import PatchError, apply, diff
from harness.agents.vllm.patches import PATCHES, VllmPatch

# the vLLM venv or the cached release wheels, no server: make test runs these once the setup is done
pytestmark = pytest.mark.vllm_source

REQUIRED = os.environ.get("OVERLAP_HARNESS_REQUIRE_VLLM") == "1"


@pytest.fixture(scope="module")
def pkg():
    why = setup_cmd.ready()
    if why:
        if REQUIRED:
            pytest.fail(f"vLLM is required here (OVERLAP_HARNESS_REQUIRE_VLLM=1) but {why}", pytrace=False)
        pytest.skip(why)
    from harness.targets.vllm.patched_copy import installed_package
    return installed_package()


def test_catalogue_covers_the_async_paths():
    from harness.targets.vllm.paths import PATHS
    rows = {r.name for r in PATHS}
    assert len(PATCHES) >= 12
    assert all(p.path in rows for p in PATCHES.values()), [p.path for p in PATCHES.values() if p.path not in rows]
    assert {"preemption_in_flight", "chunked_prefill", "penalties", "structured_output", "spec_decode_ngram",
            "prefix_cache_reset", "max_tokens_1_2", "bad_words", "min_tokens"} <= {p.path for p in PATCHES.values()}
    # at least 12 run on vLLM's CPU build; one that cannot says why, and its row is one CPU cannot run
    from harness.targets.vllm.paths import PATHS_BY_NAME
    here = [p for p in PATCHES.values() if not p.device_only]
    assert len(here) >= 12
    for p in PATCHES.values():
        if p.device_only:
            assert PATHS_BY_NAME[p.path].cpu_reason, p.name
    assert all(p.upstream and p.suite.startswith("test_") for p in PATCHES.values())


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_patch_applies_and_compiles(pkg, name):
    p = PATCHES[name]
    source = (pkg / p.file).read_text()
    after = apply(p, source)
    assert after != source
    compile(after, str(pkg / p.file), "exec")
    assert diff(p, source).count("\n-") >= 1  # a real change of vLLM's own lines


def test_missing_text_is_one_clear_error(pkg):
    gone = VllmPatch("gone", "", "x", "test_overlap_equivalence", "v1/core/sched/utils.py",
                     "this text is not in vLLM\n", "")
    with pytest.raises(PatchError, match=r"gone: the text 'this text is not in vLLM' is not found in "
                                         r"vllm/v1/core/sched/utils.py \(written against vLLM 0.32.0\)"):
        apply(gone, (pkg / gone.file).read_text())


def test_copy_patches_only_its_files_and_never_the_install(pkg, tmp_path):
    from harness.targets.vllm import patched_copy as vllm_copy
    home = tmp_path / "vllm"
    (home / "venv").mkdir(parents=True)
    os.symlink(pkg.parent.parent.parent, home / "venv" / "lib")  # the real install, read only
    names = ["max_tokens_counts_placeholders", "penalty_ids_wrong_row"]
    before = {PATCHES[n].file: (pkg / PATCHES[n].file).read_text() for n in names}
    root = vllm_copy.ensure_copy(names, home)
    for n in names:
        p = PATCHES[n]
        assert (pkg / p.file).read_text() == before[p.file]  # the install is unchanged
        assert p.replace in (root / "vllm" / p.file).read_text()
    other = "v1/core/sched/scheduler.py"  # not patched: the same file as installed
    assert (root / "vllm" / other).read_bytes() == (pkg / other).read_bytes()
    assert vllm_copy.ensure_copy(names, home) == root  # stamped: reused, not rebuilt
    path = vllm_copy.server_pythonpath(os.pathsep.join([str(setup_cmd.ROOT), "/elsewhere"]), names, home)
    assert path.split(os.pathsep) == [str(root), str(setup_cmd.ROOT), "/elsewhere"]


def test_unknown_patch_name_is_refused():
    from harness.targets.vllm.target import check_fault_names
    with pytest.raises(ValueError, match="unknown vLLM fault nope"):
        check_fault_names(["nope"])
    check_fault_names(["max_tokens_counts_placeholders", "sampled_ids_no_wait"])


def test_faults_lists_every_patch_with_its_upstream_issue(capsys):
    import argparse

    from harness.commands.check import cmd_faults
    assert cmd_faults(argparse.Namespace(target="vllm")) == 0
    out = capsys.readouterr().out
    for p in PATCHES.values():
        assert p.name in out and f"patch of vllm/{p.file}, on the {p.path} path" in out
        assert ", ".join(p.upstream) in out


# the code multi_patches.TWO_FRAMES (why vllm#48245's own form, two decode frames in flight at a preemption,
# is reached by no stock configuration) is read from: where the installed vLLM no longer has it, the reason
# is stale and must be read again
TWO_FRAMES_FROM = (
    ("v1/core/sched/async_scheduler.py", "self.decode_stagger = self.pp_size\n"),  # pp_size steps between decodes
    ("v1/core/sched/async_scheduler.py", "self.current_step + self.decode_stagger"),
    ("config/vllm.py", "            if self.use_v2_model_runner:\n                return pp_size + 1\n"),  # V2 queue
    ("config/vllm.py", "            if pp_size <= 1:\n                return 2\n        return pp_size\n"),  # V1's
    ("v1/engine/core.py", "                if len(batch_queue) < self.batch_queue_size and ("),  # full: it blocks
    ("v1/core/sched/scheduler.py", "        request.num_stale_output_tokens = request.num_in_flight_tokens\n"),
)


def test_the_two_frames_reason_still_holds_in_the_installed_source(pkg):
    from harness.agents.vllm.multi_patches import CONFIG, TWO_FRAMES, UNREACHABLE
    assert set(UNREACHABLE) <= set(PATCHES) and all(PATCHES[n].unreachable == why for n, why in UNREACHABLE.items())
    # the patch is judged where a stock configuration has a request's tokens in flight at a preemption
    assert CONFIG["preempt_stales_one_frame"] == "spec-draft" and "decode_stagger" in TWO_FRAMES
    for rel, text in TWO_FRAMES_FROM:
        assert text in (pkg / rel).read_text(), f"{rel} no longer has {text.strip()!r}: read TWO_FRAMES again"


# the code the speculative frame patches' reasons are read from (harness.agents.vllm.spec_patches)
SPEC_REASONS_FROM = (
    ("v1/core/sched/scheduler.py", "                self._preempt_request(request, timestamp, drop_stale_output=True)\n"),
    ("v1/core/sched/scheduler.py", "        request.num_computed_tokens = 0\n"),  # the preemption zeroes the counts
    ("v1/core/sched/scheduler.py", "        request.num_output_placeholders = 0\n"),
    ("v1/core/sched/scheduler.py", "                if request.num_stale_output_tokens and not request.drop_stale_output:\n"),
    ("v1/core/sched/async_scheduler.py", "            assert request.num_output_placeholders >= 0\n"),
)


def test_the_spec_frame_reasons_still_hold_in_the_installed_source(pkg):
    from harness.agents.vllm.spec_patches import UNREACHABLE
    assert all(PATCHES[n].unreachable == why for n, why in UNREACHABLE.items())
    for rel, text in SPEC_REASONS_FROM:
        assert text in (pkg / rel).read_text(), f"{rel} no longer has {text.strip()!r}"


# v1_pp_async_allowed needs pp3-v1, not pp2-v1 (multi_patches.CONFIG), read from 0.32.0's engine core:
# a structured request scheduled with its token in flight has its grammar mask deferred until the
# engine core has processed the OLDEST batch in flight; V1's queue under PP holds pipeline size
# batches and one is scheduled only while fewer are in flight, so with PP=2 the oldest is the
# request's own (the mask is right: the pp2-v1 pair passed with the refusal lifted), with PP=3 it
# may be another (vllm#45014's stale grammar)
PP_V1_DEFERRAL = (
    ("v1/engine/core.py", "                if not scheduler_output.pending_structured_output_tokens:\n"),
    ("v1/engine/core.py", "                    deferred_scheduler_output = scheduler_output\n"),
    ("v1/engine/core.py", "        assert len(batch_queue) < self.batch_queue_size\n"),
    ("v1/engine/core.py", "        future, scheduler_output, exec_model_fut = batch_queue.pop()\n"),
    ("config/vllm.py", "            if pp_size <= 1:\n                return 2\n        return pp_size\n"),
)


def test_the_lifted_v1_pp_refusal_needs_two_batches_in_flight_in_the_installed_source(pkg):
    from harness.agents.vllm.multi_patches import CONFIG
    assert CONFIG["v1_pp_async_allowed"] == "pp3-v1"
    for rel, text in PP_V1_DEFERRAL:
        assert text in (pkg / rel).read_text(), f"{rel} no longer has {text.strip()!r}: read pp3-v1's reason again"
