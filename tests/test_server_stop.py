"""Servers stop together: every server of a pair (and every pair at exit) is asked with SIGTERM
before any is waited for, so their shutdowns overlap (a gate ends with up to three vLLM pairs).
Shown without a clock: the first stand-in, on SIGTERM, waits for a sign that the second one was
asked too; asked one after the other, it would be waited for (then killed) before the second
ever heard."""
import os
import sys

from harness.targets.served.process import ServerProcess, stop_each

_WAITER = ("import os, signal, sys, time\n"
           "def end(*_):\n"
           "    deadline = time.monotonic() + float(sys.argv[3])\n"
           "    while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:\n"
           "        time.sleep(0.05)\n"
           "    open(sys.argv[1], 'w').write('saw' if os.path.exists(sys.argv[2]) else 'alone')\n"
           "    sys.exit(0)\n"
           "signal.signal(signal.SIGTERM, end)\n"
           "open(sys.argv[1] + '.up', 'w').close()\n"
           "while True: time.sleep(0.1)\n")
_TOLD = ("import signal, sys, time\n"
         "def end(*_):\n"
         "    open(sys.argv[1], 'w').close()\n"
         "    sys.exit(0)\n"
         "signal.signal(signal.SIGTERM, end)\n"
         "open(sys.argv[1] + '.up', 'w').close()\n"
         "while True: time.sleep(0.1)\n")


def _pair(tmp_path, patience):
    a_out, b_mark = tmp_path / "a.txt", tmp_path / "b.txt"
    a = ServerProcess("waiter", [sys.executable, "-c", _WAITER, str(a_out), str(b_mark), str(patience)], dict(os.environ),
                      tmp_path / "a.log", cwd=tmp_path)
    b = ServerProcess("told", [sys.executable, "-c", _TOLD, str(b_mark)], dict(os.environ), tmp_path / "b.log",
                      cwd=tmp_path)
    import time
    deadline = time.monotonic() + 30
    while not ((tmp_path / "a.txt.up").exists() and (tmp_path / "b.txt.up").exists()):
        assert time.monotonic() < deadline, "the stand-ins did not start"
        time.sleep(0.05)
    return a, b, a_out


def test_servers_are_all_asked_before_any_is_waited_for(tmp_path):
    a, b, a_out = _pair(tmp_path, patience=8)
    stop_each([a, b], grace=10.0)
    assert a_out.read_text() == "saw"
    assert a.proc.poll() is not None and b.proc.poll() is not None


def test_one_by_one_the_first_would_be_stopped_alone(tmp_path):
    """The same stand-ins stopped one after the other: the first ends before the second is asked
    (what the test above rules out: it can fail)."""
    a, b, a_out = _pair(tmp_path, patience=1)
    a.stop(grace=10.0)
    b.stop(grace=10.0)
    assert a_out.read_text() == "alone"
