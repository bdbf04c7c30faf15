"""`check --json FILE`: the gate's verdict as one JSON object, what `sweep` reads per release.

Every case gets one status of STATUSES (harness.verdict.Status, decided by the suite and put on
its report by the plugin, never read from its words), its finding code and a detail line; a row
is a path of the paths suite (`test_paths[preemption]` -> row `preemption`, its steps case -> row
`steps`) or, for any other
suite, the suite itself (its first finding). The object says which release ran and what the
agent adapted there, when the target knows it.
"""
from __future__ import annotations

import json
import os
import re

from harness.verdict import Status

PASS, FAIL, KNOWN, NA, NOT_EXERCISED, HANG, CRASH, SKIPPED = (str(s) for s in Status)
STATUSES = (PASS, FAIL, KNOWN, NA, NOT_EXERCISED, HANG, CRASH, SKIPPED)
# how bad a status is, for a row that sums several cases (a suite): the worst one stands
# a skipped case (a speculative variant on a target without a drafter) says nothing against the
# cases that ran: a suite row is "skipped" only when all of its cases were
_RANK = {SKIPPED: -1, PASS: 0, NA: 2, KNOWN: 3, NOT_EXERCISED: 4, FAIL: 5, HANG: 6, CRASH: 7}
SCHEMA = 2  # 2: each case and row has its finding code ("finding") and a known entry's id ("known")


def known_id(row: dict) -> str:
    """The known-upstream id of a KNOWN UPSTREAM row or case; a schema-1 file (no "known") keeps it
    as the detail's first word ("<id>: <finding>")."""
    if "known" in row:
        return row["known"]
    return row.get("detail", "").split(":", 1)[0].strip()


def row_name(case: dict) -> str:
    """A case's row: the parameter of a paths-suite case, else its suite."""
    m = re.search(r"\[(.+)\]$", case["id"])
    if case["suite"] == "test_paths":
        if m:
            return m.group(1)
        return case["id"].rsplit("::", 1)[-1].removeprefix("test_")  # test_steps -> steps
    return case["suite"]


def rows(cases: list[dict]) -> dict[str, dict]:
    """Row -> {"status", "detail"}: a path row is its case; a suite row is its worst case (the
    first of them), so one failing case of twenty makes the suite's row FAIL with its finding."""
    out: dict[str, dict] = {}
    for c in cases:
        name = row_name(c)
        cur = out.get(name)
        if cur is None or _RANK[c["status"]] > _RANK[cur["status"]]:
            out[name] = {"status": c["status"], "finding": c.get("finding", ""), "known": c.get("known", ""),
                         "detail": c["detail"]}
    return out


def report(res, target: str, verdict: str, release: str | None = None, adapted=(), hangs=(), crashes=()) -> dict:
    """The JSON object of one gate run (res: harness.gate.GateResult)."""
    out = {"schema": SCHEMA, "target": target, "release": release, "adapted": list(adapted),
           "verdict": verdict, "seconds": round(res.seconds, 1), "exit_code": res.exit_code,
           "suites": {s.suite: {"cases": s.cases, "passed": s.passed, "failed": s.failed, "skipped": s.skipped,
                                "first_finding": s.first_failure, "seconds": round(s.seconds, 1)} for s in res.suites.values()},
           "rows": rows(res.cases), "cases": res.cases, "paths": list(res.paths),
           "path_overlap": list(res.path_overlap), "pairs": list(res.pairs), "known": list(res.known),
           "known_gone": list(res.known_gone), "claims": list(getattr(res, "claims", ())), "hangs": [h.get("line", "") for h in hangs],
           # each death once (issue 36: the pair restarts after it and the gate goes on)
           "deaths": [{"kind": "HANG", "line": h.get("line", ""), "case": h.get("case", ""),
                       "report": h.get("report", "")} for h in hangs]
           + [{"kind": "CRASH", "line": c.get("line", ""), "case": c.get("case", ""),
               "exit_code": c.get("exit_code"), "known": c.get("known", ""), "log": c.get("log", "")}
              for c in crashes]}
    return out


def write(path: str, obj: dict) -> None:
    """Written whole, then renamed: a sweep reading it never sees half a file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)
