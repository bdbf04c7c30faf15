"""The CLI as a user runs it: a real subprocess, one-line errors with exit code 2."""
import json
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "harness.cli"]


def oh(*args, **kw):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=300, **kw)


def test_run_json_overlap_matches_no_overlap():
    a = oh("run", "--prompt", "hello there", "--prompt", "x", "--max-tokens", "6", "--json")
    b = oh("run", "--prompt", "hello there", "--prompt", "x", "--max-tokens", "6", "--json", "--no-overlap")
    assert a.returncode == 0, a.stderr
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    assert [o["token_ids"] for o in ja["outputs"]] == [o["token_ids"] for o in jb["outputs"]]
    s = ja["summary"]
    assert s["steps"] > 0 and s["overlap"] is True and jb["summary"]["overlap"] is False
    for k in ("gpu_idle_gap_ms", "host_stall_ms", "cpu_prepare_ms", "cpu_launch_ms", "cpu_process_ms"):
        assert k in s


def test_run_text_output_has_summary(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt": "abc", "max_tokens": 3}\n\n{"prompt": "def", "stop": ["z"]}\n')
    r = oh("run", "--prompts", str(p), "--policy", "pct:1:3", "--seed", "4")
    assert r.returncode == 0, r.stderr
    assert "[req0] (length, 3 tokens)" in r.stdout and "GPU idle gap" in r.stdout and "seed 4" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (["run", "--model", "nope", "--prompt", "x"], "invalid choice"),
    (["run", "--prompt", "x", "--max-tokens", "0"], "--max-tokens must be between 1 and"),
    (["run", "--prompt", "x" * 400], "does not fit"),
    (["run", "--prompt", "x", "--policy", "sometimes"], "bad policy"),
    (["run", "--prompt", "x", "--fault", "nosuch"], "unknown fault nosuch; known: no_fence"),
    (["run"], "no prompts"),
    (["run", "--prompts", "/nonexistent.jsonl"], "cannot read --prompts"),
    (["run", "--prompt", "x", "--pool-slots", "1"], "--pool-slots must be between 2 and"),
])
def test_bad_input_is_one_line_exit_2(args, needle):
    r = oh(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_malformed_prompts_file(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "ok"}\n{not json\n')
    r = oh("run", "--prompts", str(p))
    assert r.returncode == 2 and f"{p}:2: not JSON" in r.stderr
    p.write_text('[1, 2]\n')
    r = oh("run", "--prompts", str(p))
    assert r.returncode == 2 and "expected an object" in r.stderr


@pytest.mark.parametrize("args", [
    ["run", "--prompt", "x", "--max-tokens", "0"], ["run", "--prompt", "x", "--policy", "sometimes"],
    ["check", "--seeds", "0"], ["stress", "--minutes", "-1"], ["gsm8k", "--limit", "0"], ["serve", "--port", "-3"],
])
def test_bad_input_is_reported_before_torch_is_imported(args):
    """The flags are checked before anything imports torch (about a second of CPU per process): a
    typo costs its user, and each of this suite's bad-input subprocesses, a tenth of that."""
    code = "import sys; from harness.cli import main; rc = main(sys.argv[1:]); print(rc, 'torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["2", "False"], (r.stdout, r.stderr[-2000:])
