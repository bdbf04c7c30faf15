"""The real-engine server pairs the tests share, one per test process (scripts/test.sh runs each
engine's tests in one), since a start costs a minute (vLLM) to several (SGLang on these CPUs) and
every module restarting one cost minutes of CI: vLLM's for the session (conftest.py imports these
fixtures everywhere), SGLang's for tests/test_sglang_pair.py. A missing setup skips with the reason,
or fails under OVERLAP_HARNESS_REQUIRE_VLLM=1 / OVERLAP_HARNESS_REQUIRE_SGLANG=1 (.ci/run), so CI
cannot pass with a real engine silently skipped."""
import os

import pytest

REQUIRE = {"vllm": "OVERLAP_HARNESS_REQUIRE_VLLM", "sglang": "OVERLAP_HARNESS_REQUIRE_SGLANG"}
REQUIRED = os.environ.get(REQUIRE["vllm"]) == "1"


def unavailable(engine: str, why: str):
    var = REQUIRE[engine]
    if os.environ.get(var) == "1":
        pytest.fail(f"{'vLLM' if engine == 'vllm' else 'SGLang'} is required here ({var}=1) but {why}",
                    pytrace=False)
    pytest.skip(why)


def vllm_unavailable(why: str):
    unavailable("vllm", why)


def start_pair(engine: str, pairs, out_dir: str | None = None, **kw):
    """The engine's pair of the default model in `pairs` (the session's harness.targets.Pairs),
    started (or a skip / failure with the reason).
    `out_dir`: where what a HANG or CRASH report points to is kept (pytest's temporary folders),
    not left in /tmp as the work folder (a test that provokes a crash on purpose still leaves one)."""
    from harness.targets.base import TargetUnavailable
    if engine == "vllm":
        from harness.targets.vllm import setup
    else:
        from harness.targets.sglang import setup
    why = setup.ready()
    if why:
        unavailable(engine, why)
    try:
        t = pairs.get(engine, **({"out_dir": out_dir} if out_dir else {}), **kw)
        t.start()
    except TargetUnavailable as e:
        unavailable(engine, str(e))
    return t


def hand_back(pair, engine: str, pairs) -> None:
    """The pair as the next test expects it whatever this one did: stock faults, and a server the
    watchdog stopped or that died started again when next used (a test that leaves a hang behind
    fails itself, not every test after it)."""
    from harness.search.served.judge import restart_lost
    if pair.faults:
        pairs.get(engine, ())
    restart_lost(pair)


def pair_fixtures(engine: str, scope: str, **kw):
    """The one pair fixture of every engine, as the three fixtures a test asks for: `<engine>_pair`
    (started once per `scope` in the session's harness.targets.Pairs, its servers stopped after),
    `<engine>` (that pair, handed back stock after each test: hand_back) and `tok` (its tokenizer).
    `kw`: the target's settings."""
    pair_name = f"{engine}_pair"

    @pytest.fixture(scope=scope, name=pair_name)
    def pair(tmp_path_factory, oh_pairs):
        yield start_pair(engine, oh_pairs, str(tmp_path_factory.mktemp(f"{engine}-kept")), **kw)
        oh_pairs.close()

    @pytest.fixture(name=engine)
    def stock(request, oh_pairs):
        p = request.getfixturevalue(pair_name)
        yield p
        hand_back(p, engine, oh_pairs)

    @pytest.fixture(scope=scope, name="tok")
    def tok(request):
        return request.getfixturevalue(pair_name).tokenizer()
    return pair, stock, tok


vllm_pair, vllm, tok = pair_fixtures("vllm", "session")


@pytest.fixture(scope="module", name="pairs")
def own_vllm_pairs():
    """A module's own served pairs (harness.targets.Pairs) for tests whose servers are their own
    (a configuration or a patch no other test shares), closed after the module; a skip with the
    reason without the vLLM setup."""
    from harness import targets
    from harness.targets.vllm import setup
    why = setup.ready()
    if why:
        pytest.skip(why)
    p = targets.Pairs()
    yield p
    p.close()
