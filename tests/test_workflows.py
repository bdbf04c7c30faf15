"""The CI a team can adopt: .github/workflows/*.yml parse, every `overlap-harness` command they
(and ci/gpu-check.sh) run exists in our CLI with those flags (checked with the real parser),
every script / test file / module they name exists; ci/gpu-check.sh is valid bash and says
"no GPU" on a machine without one; `check --device cuda` refuses cleanly without CUDA."""
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.flags import UsageError
from harness.cli import make_parser

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
# shell variables that stand for a flag value in ci/gpu-check.sh
GPU_CHECK_VARS = {"$dev": "cuda"}


def _is_oh(tok: str) -> bool:
    return tok == '"${OH[@]}"' or tok == "${OH[@]}" or os.path.basename(tok) == "overlap-harness"


def shell_lines(script: str):
    return [ln.strip() for ln in script.replace("\\\n", " ").splitlines()
            if ln.strip() and not ln.strip().startswith("#")]


def _split(line: str) -> list[str]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    return list(lex)


PUNCT = re.compile(r"^[;&|<>()]+$")
LEADERS = {"if", "then", "elif", "else", "do", "!", "time", "exec", "{"}


def oh_commands(script: str, subst=None):
    """Every overlap-harness invocation in a shell script (a word at command position whose
    name is overlap-harness), as its argument list; a sanitize command's inner command comes
    back as its own entry too."""
    out = []
    for line in shell_lines(script):
        for k, v in (subst or {}).items():
            line = line.replace(k, v)
        line = line.replace('"${OH[@]}"', "overlap-harness")
        try:
            toks = _split(line)
        except ValueError:
            continue
        i, at_cmd = 0, True
        while i < len(toks):
            t = toks[i]
            if t == "(" and i and toks[i - 1].endswith("="):  # an array assignment, not a command
                while i < len(toks) and toks[i] != ")":
                    i += 1
            elif PUNCT.match(t):
                at_cmd = True
            elif at_cmd and t in LEADERS:
                pass
            elif at_cmd and t == "timeout":
                i += 1  # its duration
            elif at_cmd and _is_oh(t):
                j = i + 1
                while j < len(toks) and not PUNCT.match(toks[j]):
                    j += 1
                args = toks[i + 1:j]
                out.append(args)
                if args and args[0] == "sanitize" and "--" in args:
                    inner = args[args.index("--") + 1:]
                    if inner and _is_oh(inner[0]):
                        out.append(inner[1:])
                i, at_cmd = j, True
                continue
            else:
                at_cmd = "=" in t and not t.startswith("-") and at_cmd  # VAR=value prefixes keep the position
            i += 1
    return out


def cli_problems(commands) -> list[str]:
    bad = []
    for args in commands:
        if args and args[0] == "sanitize" and "--" in args:
            args = args[:args.index("--") + 1] + ["true"]  # the inner command is checked on its own
        try:
            make_parser().parse_args(args)
        except UsageError as e:
            bad.append(f"overlap-harness {' '.join(args)}: {e}")
        except SystemExit:  # --help and friends: not a command a workflow should run
            bad.append(f"overlap-harness {' '.join(args)}: exits the parser")
    return bad


def named_files(script: str) -> list[str]:
    toks = [t for ln in shell_lines(script) for t in re.split(r"[\s\"']+", ln)]
    return [t for t in toks if re.fullmatch(r"\.?[\w-]+(/[\w.-]+)*\.(sh|py)|\.ci/run", t)
            and not t.startswith(("$", "/"))]


def modules(script: str) -> list[str]:
    return re.findall(r"python -m ([\w.]+)", script)


def runs(path: Path) -> list[str]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict) and doc.get("jobs"), path
    out = []
    for name, job in doc["jobs"].items():
        assert job.get("runs-on") and job.get("steps"), f"{path.name}:{name}"
        for st in job["steps"]:
            assert "run" in st or "uses" in st, f"{path.name}:{name}: a step with neither run nor uses"
            if "run" in st:
                out.append(st["run"])
    return out


def test_the_three_workflows_are_there():
    assert {p.name for p in WORKFLOWS} >= {"cpu.yml", "gpu-gate.yml", "nightly-gsm8k.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_commands_exist_with_those_flags(path):
    scripts = runs(path)
    cmds = [c for s in scripts for c in oh_commands(s)]
    assert cli_problems(cmds) == []
    for s in scripts:
        for f in named_files(s):
            assert (ROOT / f).exists(), f"{path.name} names {f}, which does not exist"
        for m in modules(s):
            if m != "pytest":
                assert importlib.util.find_spec(m) is not None, f"{path.name} runs python -m {m}"


def test_the_workflows_do_what_they_promise():
    text = {p.name: p.read_text() for p in WORKFLOWS}
    gate = [c for s in runs(ROOT / ".github/workflows/gpu-gate.yml") for c in oh_commands(s)]
    assert any(c[:1] == ["check"] and "--device" in c and c[c.index("--device") + 1] == "cuda" for c in gate)
    assert any(c[:1] == ["sanitize"] for c in gate)
    assert "ci/gpu-check.sh" in text["gpu-gate.yml"] and "tests/test_sglang_target.py" in text["gpu-gate.yml"]
    nightly = [c for s in runs(ROOT / ".github/workflows/nightly-gsm8k.yml") for c in oh_commands(s)]
    assert all(c[0] == "gsm8k" and "--history" in c and "--trend" in c for c in nightly) and len(nightly) == 2
    assert text["nightly-gsm8k.yml"].count("actions/upload-artifact") == 2
    assert "bash .ci/run" in text["cpu.yml"]


def test_the_checker_catches_a_wrong_flag():
    """The checks above can fail: a flag or sub-command that does not exist is named."""
    bad = cli_problems(oh_commands('x=1; "$V/bin/overlap-harness" check --no-such-flag 1 | tee log\n'
                                   "overlap-harness sanitize --tool memcheck -- overlap-harness run --no-device cuda\n"
                                   "overlap-harness frobnicate\n"))
    assert len(bad) == 3 and "--no-such-flag" in bad[0] and "--no-device" in bad[1] and "frobnicate" in bad[2]
    assert named_files("bash ci/nope.sh && .venv/bin/python -m x") == ["ci/nope.sh"]


def test_gpu_check_commands_exist_and_it_is_valid_bash():
    script = (ROOT / "ci" / "gpu-check.sh").read_text()
    r = subprocess.run(["bash", "-n", str(ROOT / "ci" / "gpu-check.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cmds = oh_commands(script, GPU_CHECK_VARS)
    subs = {c[0] for c in cmds}
    assert {"run", "check", "sanitize"} <= subs, subs
    assert cli_problems(cmds) == []
    # the V2 gate step attacks the image's own vLLM (no overlay, no interpreter: docs/vllm-v2.md)
    v2 = [c for c in cmds if c[:1] == ["check"] and "--vllm-python" in c]
    assert v2 and all(c[c.index("--target") + 1] == "vllm" and "--vllm-version" not in c for c in v2), v2


def test_gpu_check_says_no_gpu_on_a_cpu_machine(tmp_path):
    from harness.device.cuda import cuda_unavailable_reason
    if cuda_unavailable_reason() is None:
        pytest.skip("this machine has a GPU")
    r = subprocess.run(["bash", str(ROOT / "ci" / "gpu-check.sh")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable})
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no GPU:") and "nothing was checked" in lines[0]
    assert not (ROOT / ".cache" / "venv-gpu").exists() or os.environ.get("GPU_VENV")
    assert "no GPU" in (tmp_path / "gpu-check.log").read_text()


def test_check_device_cuda_without_cuda_is_one_line(capsys):
    from harness.cli import main
    from harness.device.cuda import cuda_unavailable_reason
    if cuda_unavailable_reason() is None:
        pytest.skip("this machine has a GPU")
    assert main(["check", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0]
    assert main(["check", "--device", "cuda", "--target", "vllm"] if "vllm" in _targets() else
                ["check", "--device", "cuda", "--target", "ref", "--fault", "nope"]) == 2


def _targets():
    from harness.targets import TARGETS
    return TARGETS


@pytest.mark.gpu
def test_a_suite_runs_on_the_cuda_ref_engine():
    """`check --device cuda` end to end on one suite (the whole gate runs in ci/gpu-check.sh)."""
    from harness.device.cuda import cuda_unavailable_reason
    from harness.gate import run_suites
    why = cuda_unavailable_reason()
    if why:
        pytest.skip(why)
    res = run_suites("ref", suites=["test_relay_hygiene"], device="cuda")
    assert res.exit_code == 0 and res.suites and all(s.failed == 0 and s.passed > 0 for s in res.suites.values())
    bad = run_suites("ref", faults=["no_fence"], suites=["test_war_slot_table"], device="cuda")
    assert any(s.failed for s in bad.suites.values()), "the detector must see a missing fence on cuda too"
