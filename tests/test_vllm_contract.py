"""The vLLM agent's patch points exist in the installed vLLM (read with ast, vLLM not started),
and a renamed one is named: when vLLM moves a point, this says which, before any server runs."""
import os
import shutil
import sys

import pytest

from harness.targets.vllm import setup as setup_cmd
from harness.agents.vllm.points import POINTS, check_source
from harness.targets.vllm.releases import PINNED

# the vLLM venv or the cached release wheels, no server: make test runs these once the setup is done
pytestmark = pytest.mark.vllm_source

REQUIRED = os.environ.get("OVERLAP_HARNESS_REQUIRE_VLLM") == "1"


@pytest.fixture(scope="module")
def site_packages():
    home = setup_cmd.vllm_home()
    d = home / "venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    if not (d / "vllm").is_dir():
        found = sorted((home / "venv" / "lib").glob("python*/site-packages/vllm"))
        if not found:
            msg = f"no vLLM in {home / 'venv'}: run `overlap-harness setup vllm`"
            pytest.fail(msg) if REQUIRED else pytest.skip(msg)
        d = found[0].parent
    return d


def test_every_patch_point_exists(site_packages):
    # the installed release by name: an unnamed one counts as a later release, without V1's worker points
    assert check_source(site_packages, PINNED) == []


def test_a_renamed_point_is_named(site_packages, tmp_path):
    p = next(p for p in POINTS if p.name == "penalty_ids")
    rel = p.module.replace(".", "/") + ".py"
    for q in POINTS:  # copy just the modules the points live in
        src = site_packages / (q.module.replace(".", "/") + ".py")
        dst = tmp_path / (q.module.replace(".", "/") + ".py")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst)
    f = tmp_path / rel
    f.write_text(f.read_text().replace("def update_async_output_token_ids(", "def update_async_output_ids("))
    problems = check_source(tmp_path, PINNED)
    assert len(problems) == 1 and "InputBatch.update_async_output_token_ids" in problems[0], problems


def test_setup_again_is_a_no_op(site_packages, capsys):
    """A second `setup vllm` finds everything in place and installs nothing."""
    from harness.cli import main
    assert main(["setup", "vllm"]) == 0
    err = capsys.readouterr().err
    assert "vLLM venv ready" in err and "agent installed" in err and "model directory ready" in err, err
    assert "installing" not in err, err


def test_check_without_setup_is_one_line(tmp_path, monkeypatch, capsys):
    from harness.cli import main
    from harness import targets
    monkeypatch.setenv("OVERLAP_HARNESS_CACHE", str(tmp_path))
    monkeypatch.setattr(targets, "_SERVED", {})
    assert main(["check", "--target", "vllm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("overlap-harness: error: target vllm: no vLLM venv in ") and "setup vllm" in err[-1]
