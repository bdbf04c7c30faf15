"""The SGLang agent's patch points against SGLang's real source (the 0.5.23 wheel, fetched with
`pip download --no-deps` into the cache folder and read with `ast`; SGLang is never imported).
When SGLang renames or reshapes a point, this names it."""
import ast
import shutil
import tomllib
from pathlib import Path

import pytest

from harness.agents.engine_source import module_file
from harness.agents.sglang.contract import check_source
from harness.agents.sglang.points import CATALOGUE, CONSTANTS, DELAY_POINTS, POINTS, POINTS_BY_NAME, SERVER_FIELDS

ROOT = Path(__file__).resolve().parent.parent


def _copy_points(src: Path, dst: Path) -> None:
    """Only the modules the table names (a few MB less to rewrite than the whole tree)."""
    mods = {p.module for p in POINTS} | {m for m, *_ in CONSTANTS} | {m for m, _ in SERVER_FIELDS}
    for m in mods:
        f = module_file(src, m)
        out = dst / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, out)


def _rewrite(root: Path, module: str, old: str, new: str) -> None:
    f = module_file(root, module)
    text = f.read_text()
    assert text.count(old) >= 1, f"{old!r} not in {f}"
    f.write_text(text.replace(old, new))


def test_every_patch_point_exists_in_sglang_0_5_23(sglang_src):
    assert (sglang_src / "sglang" / "srt" / "managers" / "scheduler.py").is_file()
    assert check_source(sglang_src) == []


@pytest.fixture(scope="module")
def points_copy(sglang_src, tmp_path_factory):
    """The modules the table names, copied once and checked complete once (each check parses them
    all: about a second, eight times over when every case checked its own copy)."""
    dst = tmp_path_factory.mktemp("sglang-points")
    _copy_points(sglang_src, dst)
    assert check_source(dst) == []
    return dst


@pytest.mark.parametrize("module,old,new,needles", [
    # the WAR barrier renamed: the fault that rewires it is named
    ("sglang.srt.managers.scheduler", "def _apply_war_barrier(self):", "def _apply_war_fence(self):",
     ["Scheduler._apply_war_barrier: not found", "sglang_no_war_barrier", "sgl"]),
    # a parameter the wrapper passes on changed
    ("sglang.srt.managers.overlap_utils", "def stash(self, future_indices: torch.Tensor, payload",
     "def stash(self, indices: torch.Tensor, payload", ["FutureMap.stash: parameters", "sglang_relay_read_before_write"]),
    # the barrier no longer waits on the read-done event (the fence-placement fault relies on it)
    ("sglang.srt.managers.scheduler", "shared_read_done_event", "read_done",
     ["Scheduler._apply_war_barrier: no longer mentions shared_read_done_event"]),
    # the plugin group renamed: the agent would never be loaded
    ("sglang.srt.plugins", 'GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"', 'GENERAL_PLUGINS_GROUP = "sglang.plugins"',
     ["GENERAL_PLUGINS_GROUP: is no longer 'sglang.srt.plugins'"]),
    # the scheduler subprocess stops loading plugins
    ("sglang.srt.managers.scheduler", "    load_plugins()\n    dp_rank", "    dp_rank",
     ["run_scheduler_process: no longer mentions load_plugins"]),
    # the host no longer blocks on the copy-done event where the host order times its wait
    ("sglang.srt.managers.scheduler_components.batch_result_processor", "result.copy_done.synchronize()",
     "pass", ["SchedulerBatchResultProcessor.process_batch_result_decode: no longer mentions synchronize"]),
    # the result processing renamed: the host order's "waits on step N" point is named
    ("sglang.srt.managers.scheduler", "def process_batch_result(\n", "def handle_batch_result(\n",
     ["Scheduler.process_batch_result: not found (used by agent point result_wait)"]),
    # a server flag the target passes is gone
    ("sglang.srt.arg_groups.fields.schedule", "    disable_overlap_schedule: A[", "    no_overlap_schedule: A[",
     ["--disable-overlap-schedule not found"]),
])
def test_a_moved_point_is_named(points_copy, tmp_path, module, old, new, needles):
    shutil.copytree(points_copy, tmp_path, dirs_exist_ok=True)  # complete: only the rewrite below breaks it
    _rewrite(tmp_path, module, old, new)
    problems = check_source(tmp_path)
    assert len(problems) >= 1, "the rewritten point went unnoticed"
    text = "\n".join(problems)
    for n in needles:
        assert n in text, text


def test_a_missing_module_is_named(tmp_path):
    problems = check_source(tmp_path)
    assert any("sglang.srt.managers.scheduler:Scheduler._apply_war_barrier: module" in p for p in problems)


def test_the_table_is_consistent():
    assert len(POINTS_BY_NAME) == len(POINTS)
    for f in CATALOGUE.values():
        assert f.point in POINTS_BY_NAME, f.name
        assert f.suite.startswith("test_")
    for d in DELAY_POINTS:
        assert d in POINTS_BY_NAME
    war = CATALOGUE["sglang_no_war_barrier"].upstream
    assert "sgl-project/sglang#26380" in war and "sgl-project/sglang#26646" in war


def test_the_agent_is_registered_in_sglangs_plugin_group():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    eps = meta["project"]["entry-points"]["sglang.srt.plugins"]
    mod, _, fn = eps["overlap_harness"].partition(":")
    tree = ast.parse((ROOT / Path(*mod.split("."))).with_suffix(".py").read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == fn for n in tree.body)


def test_a_module_of_the_same_text_is_parsed_once(tmp_path):
    """Each check copies the source tree and rewrites one module: the modules it left alone are
    not parsed again (harness.agents.engine_source keeps trees by text); a rewritten one is."""
    from harness.agents.engine_source import parse_module
    for d, body in (("a", "def f():\n    return 1\n"), ("b", "def f():\n    return 1\n"), ("c", "def g():\n    pass\n")):
        (tmp_path / d / "pkg").mkdir(parents=True)
        (tmp_path / d / "pkg" / "m.py").write_text(body)
    a, b, c = (parse_module(tmp_path / d, "pkg.m", {}) for d in "abc")
    assert a is b and c is not a and [n.name for n in c.body] == ["g"]
