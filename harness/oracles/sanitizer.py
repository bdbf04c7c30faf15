"""Did compute-sanitizer see an error inside a kernel of a run (memcheck, racecheck, synccheck, initcheck)?

`overlap-harness sanitize`: run a command under NVIDIA's compute-sanitizer and turn its
report into the verdict table and JUnit XML that `check` gives.

compute-sanitizer sees what happens *inside* kernels: out-of-bounds and misaligned accesses
(memcheck), shared-memory races between threads of one block (racecheck), bad barriers
(synccheck), reads of uninitialised device memory (initcheck). It does not see races between
streams (a schedule-stream write racing a forward-stream read of `req_to_token`): each
kernel is correct on its own there. That is what the happens-before detector in
harness/hazards is for; the two are complementary.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from xml.etree import ElementTree as ET

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
BINARY = "compute-sanitizer"
# Where the registry wheels put the binary: nvidia-cuda-sanitizer-api-cu12 (12.x) and
# nvidia-cuda-sanitizer-api (13.x, a launcher script in cu13/bin beside the real binary).
WHEEL_PATHS = ("nvidia/cuda_sanitizer_api/bin/compute-sanitizer", "nvidia/cu13/bin/compute-sanitizer",
               "nvidia/cu13/compute-sanitizer/compute-sanitizer")
INSTALL_HINT = ("install the CUDA toolkit, set CUDA_HOME, or `pip install nvidia-cuda-sanitizer-api` "
                "(CUDA 13) / `nvidia-cuda-sanitizer-api-cu12` (CUDA 12) into the python that runs the harness")


class SanitizerUnavailable(Exception):
    pass


def find_sanitizer(env=None, search_path=None) -> str:
    """PATH first, then $CUDA_HOME/bin (and /usr/local/cuda), then the registry wheels on sys.path."""
    env = os.environ if env is None else env
    found = shutil.which(BINARY, path=env.get("PATH"))
    if found:
        return found
    for home in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            cand = os.path.join(home, "bin", BINARY)
            if os.access(cand, os.X_OK):
                return cand
    for base in (sys.path if search_path is None else search_path):
        for rel in WHEEL_PATHS:
            cand = os.path.join(base or ".", rel)
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return cand
    raise SanitizerUnavailable(f"{BINARY} not found on PATH, in $CUDA_HOME/bin or in an installed "
                               f"nvidia-cuda-sanitizer-api wheel: {INSTALL_HINT}")


# Every line the sanitizer writes starts with its prefix ("========= " by default); a
# finding is an unindented line after the prefix followed by indented detail lines.
_PREFIX = re.compile(r"^(=+) ?")
_KINDS = (  # (kind, pattern on the finding's first line); first match wins
    ("invalid-access", re.compile(r"Invalid (__\w+__|\w+) (read|write|atomic)", re.I)),
    ("uninitialized-read", re.compile(r"Uninitialized .*(read|access)", re.I)),
    ("race", re.compile(r"(Potential (RAW|WAR|WAW) hazard|Race reported between)", re.I)),
    ("barrier", re.compile(r"(Barrier error|Invalid arguments|divergent thread)", re.I)),
    ("leak", re.compile(r"Leaked \d+ bytes", re.I)),
    ("api-error", re.compile(r"Program hit (\w+)", re.I)),
    ("misaligned", re.compile(r"misaligned", re.I)),
    ("device-heap", re.compile(r"(Malloc/Free error|Device heap)", re.I)),
    ("hardware-exception", re.compile(r"(Hardware exception|Warp|Illegal instruction)", re.I)),
)
_SUMMARY = re.compile(r"^(ERROR|RACECHECK|LEAK) SUMMARY: (.*)$")
_NOTHING = re.compile(r"Target application terminated before first instrumented API call", re.I)
_INFO = re.compile(r"^(COMPUTE-SANITIZER|Target application returned an error|Error: process didn't terminate"
                   r"|This application was compiled|Warning:|Note:)", re.I)
_AT = re.compile(r"\bat (.+?) in (\S+:\d+)")
_WHO = re.compile(r"by thread \(([^)]*)\) in block \(([^)]*)\)")


@dataclass
class Finding:
    kind: str
    headline: str
    details: list[str] = field(default_factory=list)
    warning: bool = False  # racecheck's "Warning:" hazards do not count as errors

    @property
    def where(self) -> str:
        for line in [self.headline] + self.details:
            m = _AT.search(line)
            if m:
                return f"{m.group(1).strip()} ({m.group(2)})"
        return ""

    def one_line(self) -> str:
        w = "" if _AT.search(self.headline) else self.where  # a race names both sites itself
        return self.headline + (f" at {w}" if w else "")


@dataclass
class Report:
    started: bool = False  # the "COMPUTE-SANITIZER" banner was seen
    nothing_checked: bool = False  # the command made no CUDA call the sanitizer could instrument
    findings: list[Finding] = field(default_factory=list)
    error_summary: int | None = None  # from "ERROR SUMMARY: N errors"
    summaries: list[str] = field(default_factory=list)

    @property
    def errors(self) -> int:
        counted = sum(1 for f in self.findings if not f.warning)
        return max(counted, self.error_summary or 0)


def parse_report(text: str) -> Report:
    rep = Report()
    cur: Finding | None = None
    for raw in text.splitlines():
        m = _PREFIX.match(raw)
        if not m or len(m.group(1)) < 3:  # the command's own output, interleaved
            continue
        body = raw[m.end():].rstrip()
        if not body.strip():
            cur = None
            continue
        if body[:1] in (" ", "\t"):
            if cur is not None:
                cur.details.append(body.strip())
            continue
        cur = None
        s = _SUMMARY.match(body)
        if s:
            rep.summaries.append(body)
            if s.group(1) == "ERROR":
                n = re.match(r"(\d+) error", s.group(2))
                rep.error_summary = (rep.error_summary or 0) + (int(n.group(1)) if n else 0)
            continue
        if body.startswith("COMPUTE-SANITIZER"):
            rep.started = True
            continue
        if _NOTHING.search(body):
            rep.nothing_checked = True
            continue
        kind = next((k for k, pat in _KINDS if pat.search(body)), None)
        if kind is None:
            if _INFO.match(body):
                continue
            kind = "other"
        body = re.sub(r"^(ERROR|Error|WARNING|Warning): ", "", body) if kind == "race" else body
        cur = Finding(kind, body.rstrip(" :"), warning=kind == "race" and raw[m.end():].lower().startswith("warning"))
        rep.findings.append(cur)
    return rep



def write_junit(path: str, rep: Report, tool: str, command_rc: int | None, seconds: float) -> None:
    errors = [f for f in rep.findings if not f.warning]
    suite = ET.Element("testsuite", name=f"compute-sanitizer.{tool}", tests="0", failures=str(len(errors)),
                       errors="0", skipped="0", time=f"{seconds:.3f}")
    cases = 0

    def case(name):
        nonlocal cases
        cases += 1
        return ET.SubElement(suite, "testcase", classname=f"compute-sanitizer.{tool}", name=name, time="0")
    for i, f in enumerate(rep.findings):
        tc = case(f"{f.kind} #{i + 1}: {f.where or f.headline}"[:200])
        text = "\n".join([f.headline] + f.details)
        if f.warning:
            ET.SubElement(tc, "system-out").text = text
        else:
            ET.SubElement(tc, "failure", message=f.one_line()[:500], type=f.kind).text = text
    if not rep.findings:
        tc = case(f"{tool}: no errors")
        if rep.error_summary:
            ET.SubElement(tc, "failure", message=f"ERROR SUMMARY says {rep.error_summary}", type="unparsed")
            suite.set("failures", "1")
    if command_rc is not None:
        tc = case("command exit status")
        if command_rc != 0:
            ET.SubElement(tc, "failure", message=f"exit status {command_rc}", type="exit")
            suite.set("failures", str(int(suite.get("failures")) + 1))
    suite.set("tests", str(cases))
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def run_under_sanitizer(binary: str, tool: str, cmd: list[str], log_path: str, extra=()) -> int:
    """Run `cmd` under the sanitizer; its report goes to log_path, the command's own output
    to our stdout/stderr. Child processes are followed (a server's scheduler subprocesses)."""
    argv = [binary, "--tool", tool, "--target-processes", "all", "--log-file", log_path, *extra, *cmd]
    proc = subprocess.Popen(argv)
    try:
        return proc.wait()
    except BaseException:  # Ctrl-C or our own failure: leave nothing running behind
        from harness.stopping import end_process
        end_process(proc, grace=30)
        raise
