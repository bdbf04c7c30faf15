import pytest

from harness.engine.build import build_engine
from harness.engine.config import EngineConfig
from tests.served_pair import tok, vllm  # noqa: F401  (the shared vLLM pair, one per session)


def pytest_collection_modifyitems(config, items):
    """Under `pytest -n N --dist loadgroup` (the Makefile's `test`), every test on the shared vLLM
    pair runs in one worker, which starts the pair once; the rest, vLLM tests with servers of
    their own included, spread over the other workers."""
    for item in items:
        if "vllm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("vllm-pair"))


@pytest.fixture
def make_engine():
    def make(**kw):
        return build_engine(EngineConfig(**kw))
    return make
