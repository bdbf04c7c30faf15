import pytest

from harness.engine.build import build_engine
from harness.engine.config import EngineConfig
from tests.served_pair import tok, vllm, vllm_pair  # noqa: F401  (the shared vLLM pair, one per session)


def _pair_order(item):
    """Stock vLLM first, then what stops the async-on server, then each source patch's tests
    together (the async-on server restarts when the patch changes, not between two tests of the
    same one). *Why the stop before the patches*: after it the first patch's restart is due anyway;
    last, after the patches, it cost a restart on stock vLLM of its own (most of a minute)."""
    m = item.get_closest_marker("on_server")
    if m is None:
        return (0, "")
    return (1, "") if m.args[0] == "stopped" else (2, m.args[0])


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The tests on the shared vLLM pair first (scripts/test.sh runs them in a process of their
    own), in the order _pair_order gives them; the rest as collected."""
    # by the fixtures a test names: `vllm` reaches the pair through request.getfixturevalue
    # (tests/served_pair.pair_fixtures), so its closure does not list `vllm_pair`
    pair = sorted((i for i in items if {"vllm_pair", "vllm"} & set(getattr(i, "fixturenames", ()))), key=_pair_order)
    ids = {id(i) for i in pair}
    items[:] = pair + [i for i in items if id(i) not in ids]


@pytest.fixture(scope="module")
def sglang_src():
    """SGLang's source of the release the agent is written against (the patch and contract tests)."""
    from harness.agents.sglang.contract import SourceUnavailable, fetch_source
    try:
        return fetch_source()
    except SourceUnavailable as e:
        pytest.skip(f"SGLang source unavailable: {e}")


@pytest.fixture
def make_engine():
    def make(**kw):
        return build_engine(EngineConfig(**kw))
    return make


@pytest.fixture
def fresh_agent(tmp_path, monkeypatch):
    """The vLLM agent's worker state made fresh for one test: a plan (release 0.32.0, facts into
    tmp_path), no facts yet, no copy engine."""
    import json
    from harness.agents import plan as planmod
    from harness.agents.vllm import copy_engine, state
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"facts_dir": str(tmp_path), "release": "0.32.0"}))
    monkeypatch.setattr(state, "PLAN", planmod.Plan(str(plan)))
    monkeypatch.setattr(state, "FACTS", {})
    monkeypatch.setattr(copy_engine, "COPY", None)
