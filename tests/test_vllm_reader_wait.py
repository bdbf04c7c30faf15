"""The agent's reader_wait (harness/agents/vllm/workarounds/reader_wait.py): vLLM's shared-memory
queue readers on CPU sleep between their looks at the written flag instead of spinning a second
after each read. Its time: docs/results/2026-12-07-ci-time-4.md."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.targets.vllm import releases as vr


def test_a_queue_reader_on_cpu_sleeps_between_looks_inside_its_spin_window(monkeypatch):
    """reader_wait: on vLLM's CPU platform, inside the second after a read, the reader sleeps
    LOOK_S and returns without vLLM's wait (its caller looks at the flag again); past that second,
    on another platform, under the plan's "reader_spin" stock switch, and for the writer's condition
    (busy_loop_s 0), vLLM's own wait runs."""
    import time
    import types

    from harness.agents.vllm import state
    from harness.agents.vllm.workarounds import reader_wait
    seen, slept = [], []
    wait = reader_wait.patch(lambda self, timeout_ms=None: seen.append(timeout_ms))
    monkeypatch.setattr(reader_wait.time, "sleep", slept.append)
    now = time.monotonic()
    for stock, cpu, last_read, busy, ours in (((), True, now, 1, True), ((), True, now - 2, 1, False),
                                              (("reader_spin",), True, now, 1, False), ((), False, now, 1, False),
                                              ((), True, now + 5, 0, False)):
        monkeypatch.setattr(state, "PLAN", types.SimpleNamespace(data={"stock": list(stock)}))
        monkeypatch.setattr(reader_wait, "_ON_CPU", [cpu])
        seen.clear(), slept.clear()
        assert wait(types.SimpleNamespace(last_read=last_read, busy_loop_s=busy), timeout_ms=50) is None
        assert (slept, seen) == (([reader_wait.LOOK_S], []) if ours else ([], [50])), (stock, cpu, last_read, busy)


_READER_PROBE = """
import json, sys, threading, time, types
import zmq
from vllm.distributed.device_communicators import shm_broadcast
from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
from harness.agents.vllm import state
from harness.agents.vllm.workarounds import reader_wait
ctx, out, did = zmq.Context(), {"on_cpu": reader_wait.on_cpu()}, {"yields": 0, "sleeps": 0}
_yield, _sleep = shm_broadcast.sched_yield, time.sleep
def counted_yield():
    did["yields"] += 1
    _yield()
def counted_sleep(s):
    did["sleeps"] += 1
    _sleep(s)
shm_broadcast.sched_yield = counted_yield  # vLLM's spin: one yield per round
reader_wait.time = types.SimpleNamespace(sleep=counted_sleep, monotonic=time.monotonic)
for name, plan in (("stock", {"stock": ["reader_spin"]}), ("agent", {})):
    state.PLAN = types.SimpleNamespace(data=plan)
    reader = SpinCondition(True, ctx, f"ipc://{sys.argv[1]}/{name}")
    wait = reader_wait.patch(SpinCondition.wait)
    flag = []  # the queue's written flag, set by a writer 0.3 s from now (no notification sent)
    threading.Timer(0.3, flag.append, (1,)).start()
    did.update(yields=0, sleeps=0)
    reader.record_read()  # a read just now: vLLM's spin window
    t, rounds = time.monotonic(), 0
    while not flag:  # acquire_read's loop: look at the flag, wait
        wait(reader, timeout_ms=5000)
        rounds += 1
    out[name] = dict(did, seen_after_s=time.monotonic() - t, rounds=rounds)
print(json.dumps(out))
"""


@pytest.mark.vllm_source
def test_the_pinned_vllms_queue_reader_sees_a_message_in_time_and_sleeps_through_the_agent(tmp_path):
    """On the pinned vLLM's own SpinCondition (no server), a reader in its spin window waiting for a
    flag a writer sets 0.3 s later: vLLM's own wait yields at every round; through reader_wait every
    round sleeps LOOK_S instead, and both see the flag once it is set. (Counted, not timed: how many
    rounds a spinner gets is the machine's load; CI's loaded runner gave 730 where an idle one gives
    tens of thousands.)"""
    import subprocess
    import sys

    from harness.agents.vllm.workarounds import reader_wait
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
    stock, agent = got["stock"], got["agent"]
    assert got["on_cpu"] is True, got
    # what each round did, not how many rounds a loaded machine allowed: vLLM's own wait yields every
    # round and never sleeps; through reader_wait every round sleeps LOOK_S and none yields
    assert stock["rounds"] >= 1 and (stock["yields"], stock["sleeps"]) == (stock["rounds"], 0), got
    assert agent["rounds"] >= 1 and (agent["yields"], agent["sleeps"]) == (0, agent["rounds"]), got
    assert agent["rounds"] * reader_wait.LOOK_S <= agent["seen_after_s"] + 1e-3, got  # a sleep is never shorter
    # the flag is seen once set, by both (the bound only a loaded machine's delay of the writer's timer)
    assert 0.29 <= agent["seen_after_s"] < 1.3 and 0.29 <= stock["seen_after_s"] < 1.3, got
