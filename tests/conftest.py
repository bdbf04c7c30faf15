import pytest

from harness.engine.build import build_engine
from harness.engine.config import EngineConfig


@pytest.fixture
def make_engine():
    def make(**kw):
        return build_engine(EngineConfig(**kw))
    return make
