"""SIGTERM ends every command the way Ctrl-C does (issue 36): the suites stop where they are (no
server pair starts again for the next case), the servers are gone, the temporary work folder is
removed, what ran is printed with the count of cases that never ran, and the exit code is 143.

Measured before: SIGTERM to `check --target vllm` stopped the first pair, failed the cases in
flight (the old handler raised SystemExit inside a case, which pytest takes for that case's
failure), started a new pair for the next case and kept going. The mechanism is tested here
on the gate's own code (run_suites, pytest, a served target shared by every case, its servers
real processes: tests/crashing_server.py with a slow completion) without vLLM's minute of
start-up; the CLI's commands on the ref engine are tested end to end."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

CLI = [sys.executable, "-m", "harness.cli"]
STAND_IN = Path(__file__).with_name("crashing_server.py")

SUITE = textwrap.dedent("""
    import sys
    import pytest
    from harness.engine.request import Request
    from harness.targets.served.pair import ServedTarget

    class Slow(ServedTarget):
        name = "slow-stand-in"
        agent_env = None
        start_timeout = 30.0
        def server_command(self, overlap, port):
            return [sys.executable, {stand_in!r}, "--port", str(port)]
        def server_env(self, overlap):
            return dict(super().server_env(overlap), STAND_IN_CRASH="0", STAND_IN_DELAY_S="2")
        def model_name(self):
            return "stand-in"
        def start(self, which=(False, True)):
            if any(o not in self.servers for o in which):
                with open({starts!r}, "a") as f:  # every pair start, for the test to count
                    f.write("start\\n")
            super().start(which)

    PAIR = []

    def pair():  # one pair for every case, started lazily, as the gate's served target
        if not PAIR:
            PAIR.append(Slow(concurrency=4))
        return PAIR[0]

    @pytest.mark.parametrize("case", range(12))
    def test_case(case):
        reqs = [Request(rid=f"r{{i}}", prompt_ids=[5, 6, 7], max_new_tokens=2) for i in range(3)]
        for overlap in (True, False):
            assert len(pair().run(reqs, overlap=overlap).outputs) == 3
""")

DRIVER = textwrap.dedent("""
    import sys, tempfile, types
    from harness import stopping, gate
    from harness.commands import check
    stopping.install()  # what harness.cli.main does first
    tempfile.tempdir = sys.argv[1]  # the target's work folder (oh-slow-stand-in-*) in the test's folder
    gate.suite_paths = lambda names=None: [sys.argv[2]]
    res = gate.run_suites("ref", progress=lambda suite, report: print("case done", file=sys.stderr, flush=True))
    a = types.SimpleNamespace(target="ref", json=None, junit=None)
    sys.exit(check._stopped(a, res) if res.interrupted else 0)
""")


def _alive(procs):
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def test_sigterm_ends_the_suites_without_a_new_server_pair(tmp_path):
    starts = tmp_path / "starts"
    suite = tmp_path / "test_slow_suite.py"
    suite.write_text(SUITE.format(stand_in=str(STAND_IN), starts=str(starts)))
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    drv = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path), str(suite)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    try:
        seen = ""
        while "case done" not in seen:
            line = drv.stderr.readline()
            assert line, f"the suite ended before its first case: {seen[-2000:]}"
            seen += line
        time.sleep(1.0)  # the second case is in flight: its requests wait on the slow server
        procs = [c for c in psutil.Process(drv.pid).children(recursive=True)]
        assert len(procs) >= 4, "expected two servers, each under its keeper"  # noqa: PLR2004
        t = time.monotonic()
        drv.send_signal(signal.SIGTERM)
        out, err = drv.communicate(timeout=60)
        took = time.monotonic() - t
    finally:
        if drv.poll() is None:
            drv.kill()
    assert drv.returncode == 143, (out, err[-3000:])
    last = out.strip().splitlines()[-1]
    assert last.startswith("TERMINATED by SIGTERM: 1 passed, 0 failed, 11 not run"), out
    assert starts.read_text().count("start") == 1, "a new server pair started after SIGTERM"
    assert took < 30, f"{took:.0f} s to stop"  # noqa: PLR2004 -- a guard against waiting out the cases
    deadline = time.monotonic() + 15
    while _alive(procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(procs), f"left running: {[p.pid for p in _alive(procs)]}"
    assert not list(tmp_path.glob("oh-slow-stand-in-*")), "the work folder was left behind"


SWEEP_DRIVER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from harness import stopping
    from harness.releases import sweep as sw
    stopping.install()
    # each release's gate: a process that runs until asked to stop, then writes its JSON as
    # `check --json` does on SIGINT (what harness/stopping.py passes SIGTERM on as)
    GATE = ("import json, signal, sys, time\\n"
            "def stop(*_):\\n"
            "    json.dump({'verdict': 'INTERRUPTED', 'rows': {}}, open(sys.argv[1], 'w'))\\n"
            "    sys.exit(130)\\n"
            "signal.signal(signal.SIGINT, stop)\\n"
            "print('gate running', flush=True)\\n"
            "time.sleep(60)\\n")
    sw.check_command = lambda version, json_path, extra=(): [sys.executable, "-c", GATE, str(json_path)]
    res = sw.run_sweep(["0.1.0", "0.2.0"], sw.gate_release, Path(sys.argv[1]),
                       progress=lambda s: print(s, file=sys.stderr, flush=True))
    print([(r.version, r.verdict, r.exit_code) for r in res], flush=True)
    sys.exit(stopping.exit_code() if stopping.requested() else 0)
""")


def test_sigterm_ends_a_sweep_after_its_release_wrote_what_it_found(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    drv = subprocess.Popen([sys.executable, "-c", SWEEP_DRIVER, str(tmp_path)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "0.1.0.log").exists() or "gate running" not in (tmp_path / "0.1.0.log").read_text():
            assert time.monotonic() < deadline and drv.poll() is None, drv.stderr.read()
            time.sleep(0.1)
        drv.send_signal(signal.SIGTERM)
        out, err = drv.communicate(timeout=30)
    finally:
        if drv.poll() is None:
            drv.kill()
    assert drv.returncode == 143, err[-2000:]
    # the release in flight kept its own result (not SIGKILLed a quarter second later); no next release
    assert out.strip() == "[('0.1.0', 'INTERRUPTED', 130)]", (out, err)
    assert not (tmp_path / "0.2.0.log").exists()


@pytest.mark.slow
def test_sigterm_to_check_prints_what_ran_and_exits_143(tmp_path):
    # the ref engine's gate, its cases spread over pytest-xdist workers (the default): the signal
    # reaches the command alone, as a CI runner sends it; the workers end with it
    p = subprocess.Popen(CLI + ["check", "--json", str(tmp_path / "gate.json")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    seen = ""
    try:
        while not seen.endswith("."):  # the first case passed
            ch = p.stderr.read(1)
            assert ch, f"check ended before its first case: {seen[-2000:]}"
            seen += ch
        kids = psutil.Process(p.pid).children(recursive=True)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, (out, err[-2000:])
    last = out.strip().splitlines()[-1]
    assert last.startswith("TERMINATED by SIGTERM: ") and " not run, in " in last, out
    assert "suite" in out.splitlines()[0]  # the table of what ran
    import json
    obj = json.loads((tmp_path / "gate.json").read_text())
    assert obj["verdict"] == "TERMINATED"
    assert any(s["seconds"] > 0 for s in obj["suites"].values()), obj["suites"]  # where the time went
    deadline = time.monotonic() + 15
    while _alive(kids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(kids)
