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


def verdict_of(exc: BaseException | None) -> tuple[Status, str, str] | None:
    """(status, code, known id) a suite's verdict exception carries; None for any other exception."""
    if isinstance(exc, _Verdict):
        return exc.status, exc.code, exc.known_id
    return None
