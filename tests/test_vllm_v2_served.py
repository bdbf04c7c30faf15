"""The agent on vLLM's V2 model runner with the live server pair (docs/vllm-v2.md): the worker says it
runs V2, its sampled-id copy is asynchronous (the agent's copy thread) and overlap is effective;
each V2 source patch is caught by the suite it names, which stock V2 passes.

Runs where the servers run V2 (`VLLM_USE_V2_MODEL_RUNNER=1`, or a release with only V2); skipped,
with the reason, where they run V1."""
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

from harness.agents.vllm.v2.patches import RUNNER as V2_RUNNER

V2_PATCHES = sorted(V2_RUNNER)


@pytest.fixture
def v2(vllm):
    if getattr(vllm, "runner", "v1") != "v2":
        pytest.skip("the servers run vLLM's V1 runner (VLLM_USE_V2_MODEL_RUNNER=1 runs V2; docs/vllm-v2.md)")
    return vllm


def test_v2_worker_copies_asynchronously_and_overlaps(v2, tok):
    from harness.agents import plan as planmod
    from harness.workloads import presets as workloads
    reqs = workloads.mixed(tok, 10, seed=0)
    for r in reqs:
        r.max_new_tokens = max(r.max_new_tokens, 16)
    v2.run(reqs, overlap=True)
    facts = planmod.read_facts(str(v2.facts_dir(True)))
    w = [f for f in facts if f.get("role") == "worker"][-1]
    assert w.get("runner") == "v2", w.get("runner")
    assert w.get("async_outputs", 0) > 0  # every step's ids went through the agent's copy thread
    assert w.get("books", {}).get("batch_slots") is not None
    effective, line = v2.overlap_verdict(facts, None)
    print(line)
    assert effective is True, line


def test_v2_suites_quiet_on_stock(v2):
    from harness.agents.vllm_patches import PATCHES
    from harness.gate import run_suites
    suites = sorted({PATCHES[p].suite for p in V2_PATCHES})
    res = run_suites("vllm", (), 1, suites=suites)
    for s in suites:
        assert res.suites[s].failed == 0, (s, res.suites[s].first_failure)


@pytest.mark.parametrize("patch", [pytest.param(p, marks=pytest.mark.on_server(p)) for p in V2_PATCHES])
def test_v2_patch_is_caught(v2, patch):
    from harness import targets
    from harness.agents.vllm_patches import PATCHES
    from harness.gate import run_suites
    suite = PATCHES[patch].suite
    try:
        res = run_suites("vllm", (patch,), 1, suites=[suite])
    finally:
        targets.make_target("vllm", ())
    s = res.suites[suite]
    print(f"{patch}: {suite}: {s.failed} failed: {s.first_failure}")
    assert s.failed >= 1, f"{patch}: {suite} passed on the patched V2 runner"
