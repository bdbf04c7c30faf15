"""The vLLM server pair the vLLM tests share: one per test process (scripts/test.sh runs the
vLLM tests in one), for the whole session, since a start costs most of a minute and every module
restarting it cost minutes of CI. `vllm_unavailable` skips with the reason, or fails under
OVERLAP_HARNESS_REQUIRE_VLLM=1 (.ci/run), so CI cannot pass with the real engine silently skipped."""
import os

import pytest

REQUIRED = os.environ.get("OVERLAP_HARNESS_REQUIRE_VLLM") == "1"


def vllm_unavailable(why: str):
    if REQUIRED:
        pytest.fail(f"vLLM is required here (OVERLAP_HARNESS_REQUIRE_VLLM=1) but {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def vllm_pair(tmp_path_factory):
    from harness import targets
    from harness.targets import vllm_setup as setup_cmd
    from harness.targets.base import TargetUnavailable
    why = setup_cmd.ready()
    if why:
        vllm_unavailable(why)
    try:
        # what a HANG or CRASH report points to is kept under pytest's temporary folders, not
        # left in /tmp as the work folder (a test that provokes a hang on purpose still leaves one)
        t = targets.make_target("vllm", out_dir=str(tmp_path_factory.mktemp("vllm-kept")))
        t.start()
    except TargetUnavailable as e:
        vllm_unavailable(str(e))
    yield t
    targets.close_served()


@pytest.fixture
def vllm(vllm_pair):
    """The shared pair, handed back as the next test expects it whatever this one did: stock
    faults, and a server the watchdog stopped or that died started again when next used (a test
    that leaves a hang behind fails itself, not every test after it)."""
    from harness import targets
    from harness.search.served_judge import restart_lost
    yield vllm_pair
    if vllm_pair.faults:
        targets.make_target("vllm", ())
    restart_lost(vllm_pair)


@pytest.fixture(scope="session")
def tok(vllm_pair):
    return vllm_pair.tokenizer()
