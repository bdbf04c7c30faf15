"""`overlap-harness sanitize`: run a command under compute-sanitizer and print its verdict
table (the report is read by harness/oracles/sanitizer.py)."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

from harness.oracles.sanitizer import (Finding, Report, SanitizerUnavailable, TOOLS, find_sanitizer, parse_report,
    run_under_sanitizer, write_junit)


def cmd_sanitize(a) -> int:
    from harness.flags import UsageError
    from harness.gate import format_table
    cmd = list(a.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if a.from_log and cmd:
        raise UsageError("give either --from-log FILE or a command after --, not both")
    if not a.from_log and not cmd:
        raise UsageError("no command: overlap-harness sanitize [--tool T] -- CMD ARGS...")
    for flag, path in (("--junit", a.junit), ("--log", a.log)):
        d = os.path.dirname(os.path.abspath(path)) if path else None
        if d and not (os.path.isdir(d) and os.access(d, os.W_OK)):
            raise UsageError(f"cannot write {flag} {path}: {d} is not a writable directory")
    t0 = time.perf_counter()
    rc = None
    if a.from_log:
        try:
            with open(a.from_log, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            raise UsageError(f"cannot read --from-log {a.from_log}: {e.strerror}") from None
    else:
        try:
            binary = find_sanitizer()
        except SanitizerUnavailable as e:
            raise UsageError(str(e)) from None
        if shutil.which(cmd[0]) is None and not os.path.exists(cmd[0]):
            raise UsageError(f"command not found: {cmd[0]}")
        print(f"overlap-harness sanitize: {binary} --tool {a.tool} -- {' '.join(cmd)}", file=sys.stderr)
        fd, log = tempfile.mkstemp(prefix="sanitizer-", suffix=".log", dir=os.path.dirname(os.path.abspath(a.log)) if a.log else None)
        os.close(fd)
        try:
            rc = run_under_sanitizer(binary, a.tool, cmd, log, a.sanitizer_arg)
            with open(log, encoding="utf-8", errors="replace") as f:
                text = f.read()
        finally:
            if a.log:
                os.replace(log, a.log)
            else:
                os.unlink(log)
    seconds = time.perf_counter() - t0
    rep = parse_report(text)
    if not rep.started:
        print(f"overlap-harness: error: no compute-sanitizer report found"
              f"{' in ' + a.from_log if a.from_log else ' (the sanitizer did not start; exit ' + str(rc) + ')'}",
              file=sys.stderr)
        return 2
    if rep.nothing_checked and not rep.findings:
        print("overlap-harness: error: the command made no CUDA call the sanitizer could instrument: "
              "nothing was checked (is it running on --device cuda?)", file=sys.stderr)
        return 2
    res = gate_result(rep, a.tool, rc, seconds)
    if a.junit:
        write_junit(a.junit, rep, a.tool, rc, seconds)
    print(format_table(res))
    for s in rep.summaries:
        print(s)
    failed = sum(s.failed for s in res.suites.values())
    verdict = "PASS" if failed == 0 else "FAIL"
    print(f"\n{verdict}: compute-sanitizer {a.tool}: {rep.errors} error(s)"
          + (f", command exit {rc}" if rc is not None else "") + (f"; JUnit XML: {a.junit}" if a.junit else "")
          + (f"; raw report: {a.log}" if a.log else ""))
    return 0 if failed == 0 else 1


def add_commands(sub) -> None:
    import argparse
    s = sub.add_parser("sanitize", help="run a command under compute-sanitizer; verdict table and JUnit XML",
                       description="Runs CMD under NVIDIA compute-sanitizer (kernel-level memory errors, "
                       "shared-memory races, barrier misuse, uninitialised reads) and prints a verdict: exit 0 "
                       "clean, 1 errors found, 2 could not check. Races between streams are not its job: "
                       "use `check` (the happens-before detector) for those.")
    s.add_argument("--tool", default="memcheck", choices=TOOLS, help="sanitizer tool (default memcheck)")
    s.add_argument("--junit", metavar="FILE", help="write JUnit XML")
    s.add_argument("--log", metavar="FILE", help="keep the sanitizer's raw report here")
    s.add_argument("--from-log", metavar="FILE", help="judge a report written earlier (no command is run)")
    s.add_argument("--sanitizer-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for compute-sanitizer itself (repeatable), e.g. --sanitizer-arg=--leak-check=full")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...: the command to check")
    s.set_defaults(fn=cmd_sanitize)


def gate_result(rep: Report, tool: str, command_rc: int | None, seconds: float = 0.0):
    """The sanitizer's report as the gate's verdict table: one suite per kind of finding, and the
    command's exit status (the command adapts the oracle to the gate; the oracle knows no gate)."""
    from harness.gate import GateResult, SuiteResult
    res = GateResult(seconds=seconds)
    by_kind: dict[str, list[Finding]] = {}
    for f in rep.findings:
        by_kind.setdefault(f.kind, []).append(f)
    if not by_kind:
        res.suites[f"{tool}"] = SuiteResult(f"{tool}", cases=1, passed=1)
    for kind, fs in by_kind.items():
        errs = [f for f in fs if not f.warning]
        s = SuiteResult(f"{tool}: {kind}", cases=len(fs), passed=len(fs) - len(errs), failed=len(errs))
        s.first_failure = (errs or fs)[0].one_line()
        res.suites[s.suite] = s
    if rep.error_summary and not any(not f.warning for f in rep.findings):
        # the summary counted errors whose text we did not recognise: never report a pass
        res.suites[f"{tool}: unparsed"] = SuiteResult(f"{tool}: unparsed", cases=1, failed=1,
                                                      first_failure=f"ERROR SUMMARY says {rep.error_summary}")
    if command_rc is not None:
        ok = command_rc == 0
        res.suites["command"] = SuiteResult("command", cases=1, passed=int(ok), failed=int(not ok),
                                            first_failure="" if ok else f"exit status {command_rc}")
    return res
