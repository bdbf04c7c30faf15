"""A served target stops the servers it started on every exit path: a normal end, SIGTERM (CI
cancellations, `timeout`), Ctrl-C, and its own process being killed outright. The server here
is a real process tree (a Python HTTP server that forks a child), so the process-group and
parent-death handling is what is tested, without vLLM's minute of start-up. Its temporary work
folder (oh-<target>-*: plans, facts, logs) goes with it on every path; what a report points to
is kept in the output folder first."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

DRIVER = textwrap.dedent("""
    import signal, sys, time
    from harness.targets.served.pair import ServedTarget

    # a shell that starts a job in the background (CI's, nohup) has it ignore SIGINT; Ctrl-C at a
    # terminal is what this driver stands for
    signal.signal(signal.SIGINT, signal.default_int_handler)

    class Tiny(ServedTarget):
        name = "tiny-http"
        agent_env = None
        health_path = "/"
        def server_command(self, overlap, port):
            # a server with a child of its own, like vLLM's API server and its engine core
            code = ("import subprocess, sys, http.server, socketserver;"
                    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
                    f"http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, port={port}, bind='127.0.0.1')")
            return [sys.executable, "-c", code]

    import tempfile
    tempfile.tempdir = sys.argv[1]  # a work folder of its own (oh-tiny-http-*) made in the test's folder
    t = Tiny()
    t.start()
    pids = [s.proc.pid for s in t.servers.values()]
    print(" ".join(map(str, pids)), flush=True)
    if sys.argv[2] == "normal":
        sys.stdin.readline()  # the test has seen the process trees (close() stops them at once)
        t.close()
    else:
        time.sleep(600)
""")


def _descendants(pids):
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out += [p] + p.children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    return out


def _alive(procs):
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.parametrize("how", ["normal", "sigterm", "sigint", "sigkill"])
def test_servers_stop_on_every_exit_path(tmp_path, how):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    drv = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path), how], stdout=subprocess.PIPE, text=True,
                           stdin=subprocess.PIPE, env=env)
    try:
        line = drv.stdout.readline()
        assert line.strip(), "the driver did not start its servers"
        procs = _descendants([int(x) for x in line.split()])
        assert len(procs) >= 4, "expected two servers, each with a child"  # noqa: PLR2004
        if how == "normal":
            drv.stdin.write("go\n")
            drv.stdin.flush()
        else:
            drv.send_signal({"sigterm": signal.SIGTERM, "sigint": signal.SIGINT, "sigkill": signal.SIGKILL}[how])
        drv.wait(30)
        deadline = time.monotonic() + 20
        while _alive(procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _alive(procs)
        assert not left, f"left running after {how}: {[p.pid for p in left]}"
        deadline = time.monotonic() + 10  # after SIGKILL the keepers remove the folder as they end
        while list(tmp_path.glob("oh-tiny-http-*")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not list(tmp_path.glob("oh-tiny-http-*")), f"the work folder was left behind after {how}"
    finally:
        for p in _alive(_descendants([drv.pid])):
            p.kill()


def test_report_files_are_kept_and_the_rest_removed(tmp_path, monkeypatch):
    """keep() copies a file a report points to into out_dir/<work folder>/; cleanup() removes the
    temporary work folder; a folder the caller gave is never removed."""
    import tempfile

    from harness.targets.served.pair import ServedTarget
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    class T(ServedTarget):
        name = "keep-test"
    t = T(out_dir=str(tmp_path / "out"))
    assert t.workdir.parent == tmp_path and t.workdir.name.startswith("oh-keep-test-")
    (t.workdir / "hang-on-1.txt").write_text("HANG: ...")
    kept = t.keep(t.workdir / "hang-on-1.txt")
    assert kept == tmp_path / "out" / t.workdir.name / "hang-on-1.txt" and kept.read_text() == "HANG: ..."
    t.cleanup()
    assert not t.workdir.exists() and kept.exists()
    # no output folder: the work folder itself is kept, so the report's path stays true
    u = T()
    (u.workdir / "server-on.log").write_text("log")
    assert u.keep(u.workdir / "server-on.log") == u.workdir / "server-on.log"
    u.cleanup()
    assert u.workdir.exists()
    given = tmp_path / "given"
    T(workdir=str(given)).cleanup()
    assert given.is_dir()


def test_an_output_folder_that_is_a_file_is_one_line(tmp_path, capsys):
    from harness.cli import main
    f = tmp_path / "out"
    f.write_text("")
    assert main(["check", "--target", "vllm", "--out", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"overlap-harness: error: cannot keep reports in --out {f}: it is not a directory", err
