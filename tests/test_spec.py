"""Speculative decoding: the same tokens as plain decoding, with overlap on and off, for every
drafter; the reservation's worst case (Figure 7) reproduced and held; no slot leaks."""
import pytest

from harness.workloads import presets as workloads
from harness.engine.build import build_engine
from harness.engine.config import EngineConfig
from harness.engine.request import Request
from harness.engine.spec import FIXTURES, NgramIndex
from harness.targets.ref import RefTarget

DRAFTERS = ["oracle", "ngram"] + (["mtp"] if (FIXTURES / "tiny_mtp.pt").exists() else [])


def _workload(tok, seed=0):
    reqs = workloads.mixed(tok, 10, seed=seed)
    for r in reqs:
        r.abort_after = None  # an abort ends after one more *step*, which differs with the window
    return reqs


@pytest.fixture(scope="module")
def plain():
    t = RefTarget()
    tok = t.tokenizer()
    return {s: t.run(_workload(tok, s), overlap=False, max_running=4).outputs for s in range(2)}, tok


@pytest.mark.parametrize("algo", DRAFTERS)
@pytest.mark.parametrize("overlap", [False, True])
def test_speculative_equals_plain(plain, algo, overlap):
    expected, tok = plain
    for seed, want in expected.items():
        run = RefTarget().run(_workload(tok, seed), overlap=overlap, max_running=4, spec=algo, spec_k=3)
        assert run.outputs == want
        e = run.engine
        free, cached, in_use, total = e.sched.accounting()
        assert in_use == 0 and free + cached == total  # unused reserved slots were freed
        assert not e.sched.violations


def test_speculative_with_retraction_equals_plain():
    t = RefTarget()
    tok = t.tokenizer()
    reqs = workloads.pressure(tok, seed=3)
    kw = dict(max_running=4, pool_slots=200, page_size=2)
    want = t.run(reqs, overlap=False, **kw).outputs
    run = t.run(reqs, overlap=True, spec="oracle", spec_k=3, **kw)
    assert run.engine.sched.n_retracted > 0
    assert run.outputs == want


def test_oracle_accept_lengths_span_the_range():
    t = RefTarget()
    tok = t.tokenizer()
    run = t.run(_workload(tok), overlap=True, spec="oracle", spec_k=3, spec_wrong=0.3)
    lens = set(run.engine.spec.accept_lens)
    assert lens == {1, 2, 3, 4}


def test_figure7_worst_case_ends_on_the_last_reserved_position():
    """Full acceptance every step: with overlap the CPU's count is a full window behind, and
    the window ends exactly on the last reserved slot; one reserved window is not enough."""
    t = RefTarget()
    tok = t.tokenizer()
    r = Request("fig7", [tok.bos_id] + tok.encode("The cat sat down"), max_new_tokens=24)
    run = t.run([r], overlap=True, spec="oracle", spec_k=3, spec_wrong=0.0)
    e = run.engine
    assert set(e.spec.accept_lens) == {4}
    assert e.sched.min_slack == 0 and not e.sched.violations
    bad = RefTarget(faults={"single_window"}).run([r], overlap=True, spec="oracle", spec_k=3, spec_wrong=0.0)
    assert bad.engine.sched.violations, "a single reserved window must be overrun"
    off = RefTarget().run([r], overlap=False, spec="oracle", spec_k=3, spec_wrong=0.0).engine
    assert off.sched.min_slack >= 4  # without overlap the count is never behind


def test_ngram_index():
    idx = NgramIndex()
    idx.add([1, 2, 3, 4, 5, 1, 2, 9], k=3)
    assert idx.lookup([7, 1, 2], 3) == [9, 9, 9]  # the latest continuation of (1, 2), padded
    assert idx.lookup([3, 4], 2) == [5, 1]
    assert idx.lookup([42], 2) == [42, 42]


def test_ngram_waits_for_each_step():
    """NGRAM's lookup needs the accepted tokens, so the host waits for every step: the GPU
    idles between steps even with overlap on."""
    eng, tok = build_engine(EngineConfig(overlap=True, spec="ngram", spec_k=3))
    eng.run(_workload(tok))
    from harness.device.timeline import step_summary
    assert step_summary(eng.dev)["gpu_idle_gap_ms"] > 0.1
    eng2, _ = build_engine(EngineConfig(overlap=True, spec="oracle", spec_k=3))
    eng2.run(_workload(tok))
    assert step_summary(eng2.dev)["gpu_idle_gap_ms"] < 0.05


@pytest.mark.smollm2
def test_smollm2_oracle_equals_plain():
    pytest.importorskip("transformers")
    from harness.engine.build import ModelUnavailable, load_model
    try:
        load_model("smollm2")
    except ModelUnavailable as e:
        pytest.skip(str(e))
    t = RefTarget(model="smollm2")
    tok = t.tokenizer()
    reqs = [Request(f"s{i}", tok.encode(tok.apply_chat_template([{"role": "user", "content": q}])),
                    max_new_tokens=12) for i, q in enumerate(["What is 2+3?", "Name a colour."])]
    want = t.run(reqs, overlap=False).outputs
    assert t.run(reqs, overlap=True, spec="oracle", spec_k=3).outputs == want
