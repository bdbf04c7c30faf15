"""The agent on vLLM's V2 model runner with the live server pair (docs/vllm-v2.md): the worker says it
runs V2, its sampled-id copy is asynchronous (the agent's copy thread) and overlap is effective;
each V2 source patch is caught by the suite it names, which stock V2 passes.

A pair of its own (own_servers): the release OVERLAP_HARNESS_V2_VERSION (default 0.33.0, set up
by `setup vllm --version 0.33.0`), whose servers run V2; skipped with the reason where it is not set
up (failed under OVERLAP_HARNESS_REQUIRE_VLLM=1)."""
import os

import pytest

# scheduled: a 0.33.0 pair of its own (setup vllm --version 0.33.0, which the scheduled workflow runs)
# and a restart per V2 patch; .ci/run's representatives are tests/test_vllm_v2.py (every point and
# patch against each release's source)
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.own_servers, pytest.mark.scheduled]

from harness.agents.vllm.v2.patches import RUNNER as V2_RUNNER

V2_PATCHES = sorted(V2_RUNNER)


@pytest.fixture(scope="module")
def v2_pairs():
    """A Pairs of its own: the V2 release's pair, apart from the session's pinned one."""
    from harness import targets
    version = os.environ.get("OVERLAP_HARNESS_V2_VERSION", "0.33.0")
    with targets.Pairs({"vllm": targets.ServedOptions(vllm=targets.VllmChoice(version=version))}) as pairs:
        yield pairs


@pytest.fixture(scope="module")
def v2_pair(v2_pairs):
    from harness.targets.base import TargetUnavailable
    from tests.served_pair import vllm_unavailable
    try:
        t = v2_pairs.get("vllm")
    except TargetUnavailable as e:
        vllm_unavailable(str(e))
    if t.runner != "v2":
        pytest.skip(f"vLLM {t.version} runs the {t.runner.upper()} runner here ({t.runner_why})")
    return t


@pytest.fixture
def v2(v2_pair, v2_pairs):
    yield v2_pair
    if v2_pair.faults:
        v2_pairs.get("vllm", ())


@pytest.fixture(scope="module")
def tok(v2_pair):
    return v2_pair.tokenizer()


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


def test_v2_suites_quiet_on_stock(v2, v2_pairs):
    from harness.agents.vllm.patches import PATCHES
    from harness.gate import run_suites
    suites = sorted({PATCHES[p].suite for p in V2_PATCHES})
    res = run_suites("vllm", (), 1, suites=suites, pairs=v2_pairs)
    for s in suites:
        assert res.suites[s].failed == 0, (s, res.suites[s].first_failure)


@pytest.mark.parametrize("patch", [pytest.param(p, marks=pytest.mark.on_server(p)) for p in V2_PATCHES])
def test_v2_patch_is_caught(v2, patch, v2_pairs):
    from harness.agents.vllm.patches import PATCHES
    from harness.gate import run_suites
    p = PATCHES[patch]
    suite = p.suite
    # the paths suite: only the case of the row whose workload exercises the patch (the workload
    # runs once whatever is selected; the other rows' cases would only judge it again)
    keyword = f"test_path and {p.path}" if suite == "test_paths" else None
    try:
        res = run_suites("vllm", (patch,), 1, suites=[suite], keyword=keyword, pairs=v2_pairs)
    finally:
        v2_pairs.get("vllm", ())
    s = res.suites[suite]
    print(f"{patch}: {suite}: {s.failed} failed: {s.first_failure}")
    assert s.failed >= 1, f"{patch}: {suite} passed on the patched V2 runner"
