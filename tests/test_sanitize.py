"""`overlap-harness sanitize`: the report parser on reports in compute-sanitizer's documented
text format (written by us, tests/fixtures/sanitizer), the verdict / JUnit / exit codes, the
missing-binary error, and (on a GPU with the sanitizer) a real run."""
import os
import stat
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from harness.commands.sanitize import gate_result
from harness.oracles.sanitizer import SanitizerUnavailable, find_sanitizer, parse_report

FIX = Path(__file__).parent / "fixtures" / "sanitizer"
CLI = [sys.executable, "-m", "harness.cli"]


def oh(*args, env=None):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=120, env=env)


def oh_here(capsys, *args):
    """In-process, for the cases that run no command (saves a python start each)."""
    from harness.cli import main
    code = main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def report(name):
    return parse_report((FIX / name).read_text())


def test_memcheck_findings_are_grouped_with_their_location():
    rep = report("memcheck_errors.txt")
    assert rep.started and rep.error_summary == 3 and rep.errors == 3
    kinds = [f.kind for f in rep.findings]
    assert kinds == ["invalid-access", "invalid-access", "api-error"]
    first = rep.findings[0]
    assert first.headline == "Invalid __global__ write of size 4 bytes"
    assert first.where == "gather_rows(long const*, int*, int)+0x90 (/src/relay_kernels.cu:41)"
    assert any("out of bounds" in d for d in first.details)
    assert "cudaErrorLaunchFailure" in rep.findings[2].headline


def test_clean_report_ignores_the_commands_own_output():
    rep = report("memcheck_clean.txt")
    assert rep.started and rep.findings == [] and rep.errors == 0
    res = gate_result(rep, "memcheck", 0)
    assert res.ok and list(res.suites) == ["memcheck", "command"]


def test_racecheck_errors_and_warnings():
    rep = report("racecheck_hazards.txt")
    assert [(f.kind, f.warning) for f in rep.findings] == [("race", False), ("race", True)]
    assert rep.findings[0].headline.startswith("Race reported between Write access")
    assert rep.errors == 1
    res = gate_result(rep, "racecheck", 0)
    row = res.suites["racecheck: race"]
    assert (row.cases, row.failed) == (2, 1) and "reduce.cu:22" in row.first_failure
    assert report("racecheck_clean.txt").errors == 0


@pytest.mark.parametrize("name,kind", [("synccheck_barrier.txt", "barrier"),
                                       ("initcheck_uninit.txt", "uninitialized-read")])
def test_other_tools(name, kind):
    rep = report(name)
    assert [f.kind for f in rep.findings] == [kind] and rep.errors == 1


def test_summary_count_without_recognised_findings_is_never_a_pass():
    rep = report("unrecognised.txt")
    res = gate_result(rep, "memcheck", 0)
    assert sum(s.failed for s in res.suites.values()) == 1


@pytest.mark.parametrize("name,code,needle", [
    ("memcheck_errors.txt", 1, "FAIL: compute-sanitizer memcheck: 3 error(s)"),
    ("memcheck_clean.txt", 0, "PASS"),
    ("racecheck_hazards.txt", 1, "racecheck: race"),
])
def test_cli_from_log_verdicts_and_junit(tmp_path, capsys, name, code, needle):
    tool = name.split("_")[0]
    xml = tmp_path / "s.xml"
    r = oh_here(capsys, "sanitize", "--tool", tool, "--from-log", str(FIX / name), "--junit", str(xml))
    assert r.returncode == code, r.stdout + r.stderr
    assert needle in r.stdout
    suite = ET.parse(xml).getroot().find("testsuite")
    assert int(suite.get("failures")) == (0 if code == 0 else len([f for f in report(name).findings if not f.warning]))


def test_cli_nothing_checked_is_exit_2(capsys):
    r = oh_here(capsys, "sanitize", "--from-log", str(FIX / "nothing_checked.txt"))
    assert r.returncode == 2 and "nothing was checked" in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["sanitize"], "no command"),
    (["sanitize", "--tool", "leakcheck", "--", "true"], "invalid choice"),
    (["sanitize", "--from-log", "/nonexistent.log"], "cannot read --from-log"),
    (["sanitize", "--from-log", str(FIX / "memcheck_clean.txt"), "--", "true"], "not both"),
    (["sanitize", "--junit", "/nonexistent/dir/s.xml", "--", "true"], "not a writable directory"),
    (["sanitize", "--log", "/nonexistent/dir/s.log", "--", "true"], "not a writable directory"),
])
def test_bad_input_one_line(capsys, args, needle):
    r = oh_here(capsys, *args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr


def test_missing_binary_is_one_line_exit_2(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path), "CUDA_HOME": str(tmp_path)}
    env.pop("CUDA_PATH", None)
    if os.access("/usr/local/cuda/bin/compute-sanitizer", os.X_OK):
        pytest.skip("this machine has /usr/local/cuda/bin/compute-sanitizer")
    try:
        find_sanitizer()
        pytest.skip("compute-sanitizer is installed here")
    except SanitizerUnavailable:
        pass
    r = subprocess.run(CLI + ["sanitize", "--", sys.executable, "-c", "pass"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "compute-sanitizer not found" in lines[0] and "nvidia-cuda-sanitizer-api" in lines[0]


def test_finds_the_binary_in_a_wheel_layout(tmp_path):
    b = tmp_path / "nvidia" / "cuda_sanitizer_api" / "bin" / "compute-sanitizer"
    b.parent.mkdir(parents=True)
    b.write_text("#!/bin/sh\n")
    b.chmod(b.stat().st_mode | stat.S_IXUSR)
    assert find_sanitizer(env={"PATH": ""}, search_path=[str(tmp_path)]) == str(b)
    with pytest.raises(SanitizerUnavailable):
        find_sanitizer(env={"PATH": ""}, search_path=[str(tmp_path / "nowhere")])


def test_run_path_passes_the_log_and_the_exit_status(tmp_path):
    """Our plumbing around the binary (argv, --log-file, exit status, kept log), with a
    stand-in script on PATH in the sanitizer's argv shape; the real binary is tested below."""
    fake = tmp_path / "compute-sanitizer"
    fake.write_text("#!/bin/sh\n"
                    "while [ $# -gt 0 ]; do case $1 in --log-file) log=$2; shift 2;; --*) shift 2;; *) break;; esac; done\n"
                    f"cat {FIX / 'initcheck_uninit.txt'} > \"$log\"\n"
                    "\"$@\"\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    log = tmp_path / "raw.log"
    r = oh("sanitize", "--tool", "initcheck", "--log", str(log), "--", sys.executable, "-c",
           "import sys; print('ran'); sys.exit(3)", env=env)
    assert r.returncode == 1 and "ran" in r.stdout
    assert "initcheck: uninitialized-read" in r.stdout and "command exit 3" in r.stdout
    assert "Uninitialized __global__" in log.read_text()


@pytest.mark.gpu
def test_real_sanitizer_on_the_cuda_engine(tmp_path):
    from harness.device.cuda import cuda_unavailable_reason
    why = cuda_unavailable_reason()
    if why:
        pytest.skip(why)
    try:
        find_sanitizer()
    except SanitizerUnavailable as e:
        pytest.skip(str(e))
    xml = tmp_path / "s.xml"
    r = subprocess.run(CLI + ["sanitize", "--junit", str(xml), "--", sys.executable, "-m", "harness.cli", "run",
                              "--device", "cuda", "--prompt", "hello", "--max-tokens", "4"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert ET.parse(xml).getroot().find("testsuite").get("failures") == "0"

