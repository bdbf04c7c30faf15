import pytest
import torch

from harness.device import PolicyError, make_device, parse_policy
from harness.device.timeline import step_summary


def _two_streams(policy):
    dev = make_device("sim", policy)
    a, b = dev.stream("a"), dev.stream("b")
    buf = dev.alloc("buf", (4,), torch.int64)
    return dev, a, b, buf


@pytest.mark.parametrize("policy", ["serial", "random:3", "pct:5:3", "delay:a:2"])
def test_wait_event_orders_streams(policy):
    dev, a, b, buf = _two_streams(policy)
    log = []
    a.launch("write", lambda: (buf.fill_(7), log.append("write")), cost=1.0)
    ev = a.record("written")
    b.wait_event(ev)
    b.launch("read", lambda: log.append(("read", int(buf[0]))))
    dev.synchronize()
    assert log == ["write", ("read", 7)]


def test_unordered_streams_can_run_either_way():
    orders = set()
    for seed in range(20):
        dev, a, b, buf = _two_streams(f"random:{seed}")
        log = []
        a.launch("A", lambda: log.append("A"))
        b.launch("B", lambda: log.append("B"))
        dev.synchronize()
        orders.add(tuple(log))
    assert orders == {("A", "B"), ("B", "A")}


def test_serial_runs_in_issue_order_at_issue():
    dev, a, b, buf = _two_streams("serial")
    a.launch("w", lambda: buf.fill_(3))
    assert int(buf[0]) == 3  # eager: nothing is left pending


def test_copy_to_host_needs_its_event():
    dev = make_device("sim", "pct:1:2")
    s = dev.stream("copy")
    src = dev.alloc("src", (3,), torch.int64, fill=5)
    dst = dev.pinned("dst", (3,), torch.int64)
    done = s.copy_to_host("d2h", src, dst)
    assert dst.tolist() == [0, 0, 0]  # pct lets work pile up until the host waits
    done.synchronize()
    assert dst.tolist() == [5, 5, 5]


def test_same_seed_same_execution_bit_for_bit():
    def trace(seed):
        dev = make_device("sim", f"pct:{seed}:3")
        ss = [dev.stream(n) for n in "abc"]
        log = []
        for i in range(30):
            ss[i % 3].launch(f"op{i}", lambda i=i: log.append(i))
            if i % 7 == 0:
                ss[(i + 1) % 3].wait_event(ss[i % 3].record())
        dev.synchronize()
        return log
    assert trace(4) == trace(4)
    assert len({tuple(trace(s)) for s in range(8)}) > 1


def test_virtual_clock_host_wait_and_delay():
    dev = make_device("sim", "delay:fwd:2")
    f = dev.stream("fwd")
    f.launch("k", lambda: None, cost=3.0)
    ev = f.record()
    with dev.host_phase("prepare", 0.5):
        pass
    ev.synchronize()
    assert dev.host_time() == pytest.approx(5.0)  # 2 ms injected delay + 3 ms op
    waits = [h for h in dev.host_spans if h.name == "wait"]
    assert waits[0].end - waits[0].start == pytest.approx(4.5)


def test_blocking_call_is_recorded():
    dev = make_device("sim")
    s = dev.stream("schedule")
    s.launch("x", lambda: None, cost=1.0)
    s.synchronize()
    assert [h.name for h in dev.host_spans] == ["blocking-call"]


@pytest.mark.parametrize("spec", ["bogus", "random:x", "pct:1:2:3", "delay:a:b:c", "serial:1"])
def test_bad_policy(spec):
    with pytest.raises(PolicyError):
        parse_policy(spec)


def test_step_summary_counts_steps():
    dev = make_device("sim")
    f = dev.stream("forward")
    for step in range(3):
        dev.set_step(step)
        f.launch("k", lambda: None, cost=2.0)
        with dev.host_phase("process", 1.0):
            pass
    s = step_summary(dev)
    assert s["steps"] == 3 and s["step_ms"] == pytest.approx(2.0)


def test_issue_site_points_at_caller():
    dev = make_device("sim")
    rec = dev.stream("a").launch("k", lambda: None)
    assert rec.site.startswith("tests/test_sim_device.py:")
