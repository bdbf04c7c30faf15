"""The CUDA device (harness/device/cuda.py).

Every test but the no-GPU ones needs a CUDA device and is marked `gpu`; run them with
`pytest -m gpu tests/` (ci/gpu-check.sh does). Elsewhere they skip with a one-line reason.
"""
from __future__ import annotations

import pytest
import torch

from harness.device import DeviceError, make_device
from harness.device.cuda import NO_CUDA, sync_debug

HAS_CUDA = torch.cuda.is_available()
NO_GPU_REASON = "no CUDA device: torch.cuda.is_available() is False"


def gpu(fn):
    """A test that needs a CUDA device: marked `gpu`, skipped with a reason without one."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU_REASON)(fn))


# -- without a GPU ---------------------------------------------------------------------------

@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is present: the no-GPU error cannot be provoked")
def test_cuda_without_gpu_is_a_clear_error():
    with pytest.raises(DeviceError) as ei:
        make_device("cuda", "serial")
    msg = str(ei.value)
    assert msg == NO_CUDA == "no CUDA device: torch.cuda.is_available() is False (use --device sim)"
    assert "\n" not in msg


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is present: sync_debug is active there")
def test_sync_debug_is_a_noop_with_a_reason_without_gpu():
    with sync_debug("error") as state:
        assert not state.active
        assert "torch.cuda.is_available() is False" in state.reason


# -- on a GPU ------------------------------------------------------------------------------

def _warm(dev) -> None:
    """First launches pay for lazy CUDA init and kernel loading; keep that out of timings."""
    for name in ("forward", "schedule", "copy"):
        s = dev.stream(name)
        x = dev.alloc(f"warm.{name}", (16,))
        s.launch("warm", lambda x=x: x.add_(1))
    dev.synchronize()


@gpu
def test_wait_event_orders_a_delayed_forward_stream_before_the_schedule_stream():
    dev = make_device("cuda", "delay:forward:20")  # forward's ops start 20 ms late
    fwd, sch = dev.stream("forward"), dev.stream("schedule")
    x = dev.alloc("x", (1024,), torch.int64)
    table = dev.alloc("table", (1024,), torch.int64, fill=-1)
    for i in range(1, 4):
        fwd.launch("x.write", lambda i=i: x.fill_(i))
        done = fwd.record("x.done")
        sch.wait_event(done)
        sch.launch("table.write", lambda: table.copy_(x * 10))
        ev = sch.record("table.done")
        ev.synchronize()
        assert table.cpu().tolist() == [10 * i] * 1024, f"round {i}: the schedule stream ran ahead"
    dev.finish()


@gpu
def test_wait_stream_and_stream_synchronize():
    dev = make_device("cuda", "delay:forward:10")
    fwd, sch = dev.stream("forward"), dev.stream("schedule")
    x = dev.alloc("x", (4096,))
    y = dev.alloc("y", (4096,))
    fwd.launch("x.write", lambda: x.fill_(3.0))
    sch.wait_stream(fwd)
    sch.launch("y.write", lambda: y.copy_(x + 1))
    sch.synchronize()
    assert torch.all(y.cpu() == 4.0)
    dev.finish()


@gpu
def test_copy_to_host_and_its_event_give_the_values():
    dev = make_device("cuda", "delay:copy:5")
    fwd, cp = dev.stream("forward"), dev.stream("copy")
    src = dev.alloc("src", (4096,), torch.int64)
    dst = dev.pinned("host.dst", (4096,), torch.int64)
    assert dst.is_pinned() and dst.device.type == "cpu"
    fwd.launch("src.write", lambda: torch.arange(4096, out=src))
    cp.wait_event(fwd.record("src.done"))
    done = cp.copy_to_host("src.d2h", src, dst)
    done.synchronize()
    assert dst.tolist() == list(range(4096))
    dev.finish()


def _gpu_span(dev, stream_name: str, delayed_ms: float = 0.0) -> float:
    """GPU ms from a marker event to the end of one small op on the stream."""
    s = dev.stream(stream_name)
    x = dev.alloc(f"span.{stream_name}", (256,))
    before = s.record("before")
    op = s.launch("op", lambda: x.add_(1))
    dev.finish()
    assert op.start >= before.rec.start - 1e-3 and op.end >= op.start
    return op.end - before.rec.start


@gpu
def test_delay_policy_delays_the_named_stream():
    amount = 5.0
    delayed = make_device("cuda", f"delay:forward:{amount:g}")
    plain = make_device("cuda", "serial")
    _warm(delayed)
    _warm(plain)
    d = _gpu_span(delayed, "forward")
    p = _gpu_span(plain, "forward")
    other = _gpu_span(delayed, "schedule")  # the policy names forward only
    assert d >= 0.8 * amount, f"delayed op took {d:.3f} ms of GPU time, expected >= {0.8 * amount}"
    assert d > p + 0.5 * amount, f"delayed {d:.3f} ms vs undelayed {p:.3f} ms"
    assert other < 0.5 * amount, f"schedule stream was delayed too ({other:.3f} ms)"
    # the delayed op starts after the sleep: its start is at least `amount` after its issue
    s = delayed.stream("forward")
    y = delayed.alloc("y", (8,))
    rec = s.launch("late", lambda: y.add_(1))
    delayed.finish()
    assert rec.start - rec.issue_t >= 0.8 * amount


@gpu
def test_timing_is_resolved_in_the_host_clock_without_per_op_syncs():
    dev = make_device("cuda", "serial")
    _warm(dev)
    fwd = dev.stream("forward")
    x = dev.alloc("x", (1 << 20,))
    recs = [fwd.launch(f"op{i}", lambda: x.mul_(1.0001)) for i in range(50)]
    dev.finish()
    assert all(r.end >= r.start for r in recs)
    assert all(b.start >= a.end - 1e-3 for a, b in zip(recs, recs[1:])), "a stream's ops overlap in time"
    # a GPU op cannot start before the host issued it (allow the anchor's microseconds of error)
    assert all(r.start >= r.issue_t - 0.5 for r in recs)
    assert recs[-1].end <= dev.host_time() + 0.5


@gpu
@pytest.mark.parametrize("policy", ["random:1", "pct:2:3"])
def test_random_and_pct_only_perturb_and_keep_values(policy):
    dev = make_device("cuda", policy)
    fwd, sch = dev.stream("forward"), dev.stream("schedule")
    acc = dev.alloc("acc", (64,))
    for i in range(20):
        fwd.launch("acc.add", lambda: acc.add_(1))
        sch.wait_event(fwd.record("acc.done"))
        sch.launch("acc.double", lambda: acc.mul_(2))
        fwd.wait_event(sch.record("double.done"))
    dev.finish()
    v = 0.0
    for _ in range(20):
        v = (v + 1) * 2
    assert torch.all(acc.cpu() == v)
    assert dev.policy.spec() == policy


@gpu
def test_sync_debug_raises_on_a_host_sync_and_restores_the_mode():
    prev = torch.cuda.get_sync_debug_mode()
    x = torch.ones(4, device="cuda")
    with sync_debug("error") as state:
        assert state.active
        with pytest.raises(RuntimeError):
            x.sum().item()
    assert torch.cuda.get_sync_debug_mode() == prev


# -- the engine: the same tokens on the GPU as in the simulator -------------------------------------

def _run_engine(kind: str, overlap: bool, policy: str = "serial"):
    from harness.engine.config import TINY, EngineConfig
    from harness.engine.loop import Engine
    from harness.engine.model import Model, init_tiny_weights
    from harness.engine.request import Request
    from harness.engine.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    cfg = EngineConfig(overlap=overlap, device=kind, policy=policy)
    dev = make_device(kind, policy, 0, cfg.costs.launch_ms / cfg.costs.launches_per_step)
    model = Model(TINY, init_tiny_weights(TINY, 0), dev.torch_device)
    eng = Engine(cfg, TINY, model, dev, tok.decode)
    reqs = [Request(f"r{i}", [tok.bos_id] + tok.encode(f"Hello number {i} " * (1 + i % 3)),
                    max_new_tokens=12 + i, arrival=i) for i in range(6)]
    eng.run(reqs)
    return {r.rid: list(r.output_ids) for r in reqs}, dev


@pytest.fixture
def fp32_matmuls():
    """Full fp32 matmuls on the GPU (no TF32), as on the CPU, so greedy tokens can agree."""
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(prev)


@pytest.fixture(scope="module")
def sim_tokens():
    return _run_engine("sim", overlap=False)[0]


@gpu
@pytest.mark.parametrize("overlap", [False, True], ids=["overlap-off", "overlap-on"])
def test_engine_tokens_on_cuda_match_the_sim(sim_tokens, fp32_matmuls, overlap):
    from harness.device.timeline import step_summary

    got, dev = _run_engine("cuda", overlap)
    for rid, want in sim_tokens.items():
        assert got[rid] == want, f"{rid} (overlap {'on' if overlap else 'off'}): cuda {got[rid]} != sim {want}"
    s = step_summary(dev)
    assert s["steps"] > 0 and s["step_ms"] > 0.0 and s["total_ms"] > 0.0
    assert all(op.end >= op.start for op in dev.ops if op.kind in ("kernel", "copy"))


@gpu
@pytest.mark.parametrize("policy", ["random:3", "pct:4:3", "delay:forward:0.5"])
def test_engine_tokens_under_gpu_perturbation_match_the_sim(sim_tokens, fp32_matmuls, policy):
    got, _ = _run_engine("cuda", True, policy)
    assert got == sim_tokens, f"policy {policy}: tokens differ from the sim"
