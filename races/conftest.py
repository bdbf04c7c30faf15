"""The races/ suites attack a white-box target (the ref engine, with any --oh-fault injected)."""
import pytest

from harness.targets import make_target


@pytest.fixture(scope="session")
def target(oh_options):
    t = make_target(oh_options.target, oh_options.faults, **oh_options.target_kwargs())
    if not t.white_box:
        pytest.skip(f"races/ needs a white-box target; {t.name} hides its streams and tables")
    return t


@pytest.fixture(scope="session")
def tok(target):
    return target.tokenizer()


def first_hazard_line(run) -> str:
    hz = run.hazards
    return "" if not hz else f"{len(hz)} hazard(s); first: {hz[0]}"
