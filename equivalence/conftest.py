import pytest

from harness.targets import make_target


@pytest.fixture(scope="session")
def target(oh_options):
    return make_target(oh_options.target, oh_options.faults, **oh_options.target_kwargs())


@pytest.fixture(scope="session")
def tok(target):
    return target.tokenizer()
