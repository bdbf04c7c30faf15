"""`check` as a user runs it, in a process of its own, for the scheduled tier's gates against real
engines. In one pytest process every `main()` after the first ended ERROR ("the suites could not
run") at its first configuration (2026-12-07: tests/test_multi_worker_served.py, then
tests/test_vllm_spec_served.py, 5 of 6; tests/test_vllm_configs_served.py runs two as well), and a
process of its own keeps each gate's servers and state apart. Its stderr's tail comes back too."""
import subprocess
import sys

from harness.targets.vllm import configs as vc


def check(tmp_path, *argv, target="vllm", timeout=900) -> tuple[int, dict, str]:
    """(exit code, {configuration: its line of the matrix}, stdout + the tail of stderr)."""
    p = subprocess.run([sys.executable, "-m", "harness.cli", "check", "--target", target, "--out", str(tmp_path),
                        *argv], capture_output=True, text=True, timeout=timeout)
    code, out = p.returncode, p.stdout + "\n-- stderr --\n" + p.stderr[-3000:]
    rows = {}
    for line in p.stdout.split("server configuration matrix", 1)[-1].splitlines():
        parts = line.split()
        if len(parts) > 1 and (parts[0] in vc.CONFIGS or vc.drafted(parts[0]) is not None or parts[0] == "tp2"):
            rows[parts[0]] = " ".join(parts[1:])
    return code, rows, out
