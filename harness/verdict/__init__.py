"""Verdicts as data: the status a case ends with (Status), and the finding an oracle gives
(Finding: its sentence, a short stable code, the request it is about).

A suite ends a case with a status through harness.verdict.outcome (`na`, `not_exercised`, `known`,
`fail`), never in the words of its message; the pytest plugin (harness.plugin) copies the status
and the code onto the case's report, and the gate's readers (the verdict table, `check --json`,
JUnit, the sweep) read them. Known-upstream entries claim findings by code. The prose stays for
people; no reader parses it. Below the oracles and the targets: both import it.
"""
from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    """How a case ended; the value is the word the reports print (and `check --json` writes)."""
    PASS = "pass"
    FAIL = "FAIL"
    KNOWN = "KNOWN UPSTREAM"
    NA = "n/a"
    NOT_EXERCISED = "not exercised"
    HANG = "HANG"
    CRASH = "CRASH"
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value


class Finding(str):
    """One oracle's finding: the sentence a person reads, and `code`, a short stable name of what
    was found (`divergence`, `steps.extra`, `books.leak`, ...) that a known-upstream entry claims
    it by. A str, so that every place that prints or joins findings keeps working unchanged."""
    code: str
    rid: str  # the request it is about ("": the run's), whose mechanisms a known entry's evidence is read for

    def __new__(cls, text: str, code: str, rid: str = "") -> "Finding":
        self = super().__new__(cls, text)
        self.code, self.rid = code, rid
        return self

    def __reduce__(self):  # pickled (xdist, multiprocessing) with its code
        return (Finding, (str(self), self.code, self.rid))


def code_of(finding: str) -> str:
    """A finding's code; "" for a bare sentence (no oracle named it: nothing claims it by code)."""
    return finding.code if isinstance(finding, Finding) else ""
