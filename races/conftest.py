"""The races/ suites attack a white-box target (the ref engine, with any --oh-fault injected)."""
import pytest


@pytest.fixture(scope="session")
def target(oh_options):
    t = oh_options.make()
    if not t.white_box:
        pytest.skip(f"races/ needs a white-box target; {t.name} hides its streams and tables")
    return t


@pytest.fixture(scope="session")
def tok(target):
    return target.tokenizer()


def first_hazard_line(run) -> str:
    hz = run.hazards
    return "" if not hz else f"{len(hz)} hazard(s); first: {hz[0]}"
