"""`bisect --vllm-python`: git bisect over a checkout's commits (harness.releases.commits), each
step's verdict an exit code as `replay` gives it (0 good, 1 bad, 125 cannot test). A real git
repository stands for a vLLM checkout; the step is a small script reading the tree (no server)."""
import subprocess
import sys
import types

import pytest

from harness.releases import commits


def _repo(tmp_path, states):
    """A git repo with one commit per state; the file `bug` holds the state ("0", "1" or "skip")."""
    top = tmp_path / "vllm-src"
    (top / "vllm").mkdir(parents=True)
    git = lambda *a: subprocess.run(["git", "-C", str(top), *a], check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    shas = []
    for i, s in enumerate(states):
        (top / "vllm" / "__init__.py").write_text(f"__version__ = '0.33.{i}'\n")
        (top / "bug").write_text(s)
        git("add", "-A")
        git("commit", "-qm", f"c{i}")
        shas.append(subprocess.run(["git", "-C", str(top), "rev-parse", "HEAD"], capture_output=True,
                                   text=True).stdout.strip())
    return top, shas


STEP = ("import sys; s = open('bug').read().strip(); "
        "sys.exit({'0': 0, '1': 1}.get(s, 125))")


def test_the_first_bad_commit_is_found_and_the_checkout_put_back(tmp_path):
    top, shas = _repo(tmp_path, ["0", "0", "skip", "0", "1", "1", "1"])
    first, tail = commits.bisect(top, shas[0], shas[-1], [sys.executable, "-c", STEP], timeout=120)
    assert first == shas[4], tail
    head = subprocess.run(["git", "-C", str(top), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert head == shas[-1]  # bisect reset: back where it was
    assert not (top / ".git" / "BISECT_LOG").exists()


def test_a_range_without_a_bad_commit_names_none(tmp_path):
    top, shas = _repo(tmp_path, ["0", "1"])
    first, _ = commits.bisect(top, shas[0], shas[1], [sys.executable, "-c", "raise SystemExit(0)"], timeout=120)
    assert first == ""


def test_only_a_clean_git_checkout_is_bisected(tmp_path):
    top, _ = _repo(tmp_path, ["0"])
    build = types.SimpleNamespace(python="py", checkout="", package=str(top / "vllm"))
    assert commits.checkout_of(build) == top
    (top / "bug").write_text("1")  # an uncommitted change would ride along into every step
    with pytest.raises(ValueError, match="uncommitted changes"):
        commits.checkout_of(build)
    plain = tmp_path / "site-packages" / "vllm"
    plain.mkdir(parents=True)
    with pytest.raises(ValueError, match="not in a git checkout"):
        commits.checkout_of(types.SimpleNamespace(python="py", checkout="", package=str(plain)))


def test_the_command_refuses_mixed_flags_in_one_line():
    for args in (["--vllm-python", sys.executable], ["--good", "a"], ["--vllm-python", sys.executable, "--row", "x"]):
        p = subprocess.run([sys.executable, "-m", "harness.cli", "bisect", *args], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
