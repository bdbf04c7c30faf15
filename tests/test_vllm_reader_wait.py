"""The agent's reader_wait (harness/agents/vllm/workarounds/reader_wait.py): vLLM's shared-memory
queue readers on CPU wait on the writer's notification instead of spinning a second after each
read. Its time: docs/results/2026-12-07-ci-time-4.md."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.targets.vllm import releases as vr


def test_a_queue_reader_on_cpu_waits_for_the_writer_instead_of_spinning(monkeypatch):
    """reader_wait: on vLLM's CPU platform a shared-memory queue's reader gives up its second of
    spinning (busy_loop_s 0: vLLM's own idle wait) before vLLM's wait runs; the writer's condition
    (busy_loop_s 0 already), another platform and the plan's "reader_spin" stock switch keep vLLM's."""
    import types

    from harness.agents.vllm import state
    from harness.agents.vllm.workarounds import reader_wait
    seen = []
    wait = reader_wait.patch(lambda self, timeout_ms=None: seen.append((self.busy_loop_s, timeout_ms)))
    for stock, cpu, want in (((), True, 0), (("reader_spin",), True, 1), ((), False, 1)):
        monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={"stock": list(stock)}))
        monkeypatch.setattr(reader_wait, "_ON_CPU", [cpu])
        reader = types.SimpleNamespace(busy_loop_s=1)
        seen.clear()
        wait(reader, timeout_ms=50)
        assert seen == [(want, 50)] and reader.busy_loop_s == want, (stock, cpu)
    writer = types.SimpleNamespace(busy_loop_s=0)
    monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={}))
    monkeypatch.setattr(reader_wait, "_ON_CPU", [True])
    wait(writer)
    assert writer.busy_loop_s == 0


_READER_PROBE = """
import json, os, sys, time, types
import zmq
from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
from harness.agents.vllm import state
from harness.agents.vllm.workarounds import reader_wait
ctx, out = zmq.Context(), {"on_cpu": reader_wait.on_cpu()}
for name, plan in (("stock", {"stock": ["reader_spin"]}), ("agent", {})):
    state.PLAN = types.SimpleNamespace(data=plan)
    addr = f"ipc://{sys.argv[1]}/{name}"
    writer, reader = SpinCondition(False, ctx, addr), SpinCondition(True, ctx, addr)
    wait = reader_wait.patch(SpinCondition.wait)
    time.sleep(0.3)  # the subscription reaches the writer (a notification before it is dropped)
    reader.record_read()  # a read just now: vLLM spins for busy_loop_s from here
    t = time.monotonic(); wait(reader, timeout_ms=400); idle = time.monotonic() - t
    writer.notify()
    t = time.monotonic(); wait(reader, timeout_ms=5000); woken = time.monotonic() - t
    out[name] = {"idle_s": idle, "woken_s": woken, "busy_loop_s": reader.busy_loop_s}
print(json.dumps(out))
"""


@pytest.mark.vllm_source
def test_the_pinned_vllms_queue_reader_sleeps_until_notified_through_the_agent(tmp_path):
    """On the pinned vLLM's own SpinCondition (no server): right after a read, vLLM's wait returns
    at once (a spin round, busy_loop_s 1 s); through reader_wait it sleeps on the notification
    socket for the whole timeout when nothing was written, and wakes on the writer's notify."""
    import subprocess
    import sys

    from harness.targets.vllm import setup as vllm_setup
    py = vllm_setup.venv_python(vr.home())
    if not py.exists():
        if os.environ.get("OVERLAP_HARNESS_REQUIRE_VLLM") == "1":
            pytest.fail(f"no vLLM venv at {py}: run `overlap-harness setup vllm`")
        pytest.skip(f"no vLLM venv at {py}: run `overlap-harness setup vllm`")
    root = str(Path(__file__).resolve().parents[1])
    p = subprocess.run([str(py), "-c", _READER_PROBE, str(tmp_path)], env=dict(os.environ, PYTHONPATH=root),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["on_cpu"] is True, got
    assert got["stock"]["busy_loop_s"] == 1 and got["stock"]["idle_s"] < 0.2, got
    assert got["agent"]["busy_loop_s"] == 0 and got["agent"]["idle_s"] >= 0.35, got
    assert got["agent"]["woken_s"] < 2 and got["stock"]["woken_s"] < 2, got
