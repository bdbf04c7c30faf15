import pytest


@pytest.fixture(scope="session")
def target(oh_options):
    return oh_options.make()


@pytest.fixture(scope="session")
def tok(target):
    return target.tokenizer()
