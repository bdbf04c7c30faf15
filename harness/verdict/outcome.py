"""How a suite ends a case with a status (harness.verdict.Status) and a finding code: pytest's own
outcome exceptions, carrying the two; and the status of a case from its report and the exception
that ended it (read by the plugin, harness.plugin)."""
from __future__ import annotations

import pytest

from harness.verdict import Status, code_of


class _Verdict:
    status: Status
    code: str
    known_id: str = ""


class _Skip(pytest.skip.Exception, _Verdict):
    __module__, __qualname__ = "builtins", "Skipped"  # read back as pytest's own "Skipped: why"

    def __init__(self, status: Status, code: str, msg: str):
        super().__init__(msg)
        self.status, self.code = status, code


class _Fail(pytest.fail.Exception, _Verdict):
    # printed as pytest's own "Failed: ...": the gate's messages and the JUnit XML stay as they were
    __module__, __qualname__ = "builtins", "Failed"

    def __init__(self, status: Status, code: str, msg: str):
        super().__init__(msg, pytrace=False)
        self.status, self.code = status, code


class _Known(pytest.xfail.Exception, _Verdict):
    __module__, __qualname__ = "builtins", "XFailed"

    def __init__(self, kid: str, code: str, msg: str):
        super().__init__(msg)
        self.status, self.code, self.known_id = Status.KNOWN, code, kid


def na(reason: str, code: str = "row.absent"):
    """The target has no such path (a release, a runner, a build or a configuration lacks it):
    neither a pass nor a failure."""
    raise _Skip(Status.NA, code, reason)


def not_exercised(reason: str, code: str = "not_exercised", skip: bool = False):
    """The case could not judge what it attacks: a failure (`skip`: a target's declared limit,
    reported apart), never a pass."""
    raise (_Skip if skip else _Fail)(Status.NOT_EXERCISED, code, reason)


def fail(finding: str, code: str | None = None):
    """A finding: the case fails with its code (the finding's own unless given)."""
    raise _Fail(Status.FAIL, code if code is not None else code_of(finding), str(finding))


def known(kid: str, finding: str, more: int = 0):
    """A finding a live known-upstream entry claimed: reported apart as KNOWN UPSTREAM, never a pass."""
    raise _Known(kid, code_of(finding), f"KNOWN UPSTREAM {kid}: {finding}" + (f" (+{more} more)" if more else ""))


def of_exception(exc: BaseException | None) -> tuple[Status, str, str] | None:
    """(status, code, known id) that an exception ending a case carries, by its type: a suite's
    verdict, a server's or the ref engine's HANG, a server's CRASH; None for anything else
    (a plain assertion: FAIL; a plain skip: skipped)."""
    if isinstance(exc, _Verdict):
        return exc.status, exc.code, exc.known_id
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
