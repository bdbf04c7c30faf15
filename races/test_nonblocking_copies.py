"""The host never blocks on the schedule stream while the fence chains it to a forward: checked
structurally (no blocking call on the schedule stream) and by the virtual host time spent in
blocking calls per step (about 0 with overlap). On CUDA, also under set_sync_debug_mode."""
import pytest
import torch

from races.scenarios import SCENARIOS


@pytest.mark.parametrize("scenario", ["row_reuse", "retraction", "spec_oracle"])
def test_no_blocking_call_on_schedule_stream(target, tok, scenario):
    reqs, kw, _ = SCENARIOS[scenario](tok)
    run = target.run(reqs, overlap=True, track=True, **kw)
    dev = run.engine.dev
    calls = [h for h in dev.host_spans if h.name == "blocking-call"]
    stalls = [h for h in run.hazards if h.kind == "host-stall"]
    assert not stalls, f"host stalls behind the fence: {stalls[0]}"
    assert not calls, f"{len(calls)} blocking call(s) on stream {calls[0].stream}; first at {calls[0].site}"


def test_blocking_time_per_step_is_zero(target, tok):
    reqs, kw, _ = SCENARIOS["row_reuse"](tok)
    run = target.run(reqs, overlap=True, **kw)
    dev = run.engine.dev
    blocked = sum(h.end - h.start for h in dev.host_spans if h.name == "blocking-call")
    per_step = blocked / max(1, run.engine.steps)
    assert per_step < 0.01, f"the host spends {per_step:.3f} virtual ms per step in blocking calls"


@pytest.mark.gpu
def test_prepare_has_no_sync_on_cuda(target, tok):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: set_sync_debug_mode needs a GPU")
    from harness.device.cuda import sync_debug
    reqs, kw, _ = SCENARIOS["row_reuse"](tok)
    eng, _ = target.engine(device="cuda", **kw)
    prepare = eng._prepare

    def guarded():
        with sync_debug("error"):
            return prepare()
    eng._prepare = guarded
    eng.run(reqs)
