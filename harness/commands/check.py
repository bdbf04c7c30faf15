"""`overlap-harness check` (the gate), `mutants` (the kill matrix) and `faults` (the catalogue):
their flags and what they print; the gate itself is harness/gate/."""
from __future__ import annotations

import json
import sys

from harness.flags import (UsageError, add_served_flags, check_out_dir, check_writable, served_options, vllm_choice,
                           worker_count)
from harness.gate.matrix import format_matrix, kill_matrix
from harness.gate import (conservation_line, format_table, invariance_lines,
    overlap_line, path_lines, release_line, run_suites, served_books_lines, served_crashes, served_hangs,
    served_left_out_line, served_overlap_line, served_restarts_line, served_release, start_served)


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


def cmd_check(a) -> int:
    from harness.targets import check_fault_names
    check_fault_names(a.target, a.fault, UsageError)
    check_seeds(a.seeds, UsageError)
    check_suites(a.suite, UsageError)
    vllm = vllm_choice(a, UsageError)  # the one check of --vllm-version / --vllm-python / --vllm-runner
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
          + (f", vLLM {vllm.version}" if vllm.version else "")
          + (f", vLLM of {vllm.python}" if vllm.python else "")
          + (f", runner {vllm.runner}" if vllm.runner != "auto" else ""),
          file=sys.stderr)
    if a.target != "ref":
        check_out_dir(a.out, UsageError)
        from harness.targets import fault_catalogue
        for name in a.fault:  # a patch no configuration reaches on its release: its pass means that, said
            why = getattr(fault_catalogue(a.target).get(name), "unreachable", "")
            if why:
                print(f"fault {name}: {why}")
    configs = check_configs(a, UsageError)
    if configs:
        return run_matrix(a, configs, workers, vllm)
    return _gate(a, workers, served_options(a, UsageError, vllm))


def check_configs(a, error) -> list[str]:
    """--configs NAME,...|all|all,-NAME,...: the server configurations of the matrix (vLLM's, or
    SGLang's drafters: harness/targets/sglang/spec.py)."""
    spec = getattr(a, "configs", None)
    if not spec:
        return []
    if a.target not in ("vllm", "sglang"):
        raise error(f"--configs applies to --target vllm or sglang (not {a.target})")
    return configs_of(a.target).parse(spec, error)


def configs_of(target: str):
    """The module of a target's server configurations (CONFIGS, parse)."""
    if target == "sglang":
        from harness.targets.sglang import spec as sglang_spec
        return sglang_spec
    from harness.targets.vllm import configs as vllm_configs
    return vllm_configs


def run_matrix(a, configs: list[str], workers: int, vllm) -> int:
    """The gate once per server configuration (harness.targets.vllm.configs), one pair alive at a
    time; the path suite only unless --suite names others (the whole gate is minutes a
    configuration). One table per configuration, then the matrix: each configuration's verdict."""
    import time
    table = configs_of(a.target)
    if not a.suite:
        a.suite = ["test_paths"]
    rows = []
    base = {"json": a.json, "junit": a.junit}
    for name in configs:
        c = table.CONFIGS.get(name) or table.get(name)  # vLLM: a drawn drafter (spec-<drafter>-k<k>) too
        print(f"\n== server configuration {name}: {c.flags()}", flush=True)
        for k, path in base.items():  # one report per configuration: REPORT-NAME.json / .xml
            if path:
                stem, dot, ext = path.rpartition(".")
                setattr(a, k, f"{stem}-{name}.{ext}" if dot and "/" not in ext else f"{path}-{name}")
        t = time.perf_counter()
        # one pair alive at a time: each configuration's gate closes its pairs
        code, verdict = _gate(a, workers, served_options(a, UsageError, vllm, config=name), matrix=True)
        rows.append((name, verdict, time.perf_counter() - t))
        if code not in (0, 1):
            break
    print("\nserver configuration matrix (verdict, seconds with the pair's start):")
    for name, verdict, sec in rows:
        print(f"  {name:16} {verdict}  ({sec:.0f} s)")
    bad = [n for n, v, _ in rows if not v.startswith("PASS")]
    print(f"\n{'FAIL' if bad else 'PASS'}: {len(rows) - len(bad)} of {len(configs)} configuration(s) pass"
          + (f"; failing: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


def _gate(a, workers: int, options, matrix: bool = False):
    """One gate: the servers (in options.config, when the matrix runs), the suites, the verdict;
    its pairs (harness.targets.Pairs) closed at its end."""
    try:
        pairs = start_served(a.target, a.fault, UsageError_(matrix), options)
    except _ConfigDown as e:  # in the matrix, a configuration that does not start is its row, not the end
        print(f"CANNOT START: {e}")
        return 1, f"CANNOT START: {e}"
    try:
        return _judge(a, workers, pairs, options, matrix)
    finally:
        pairs.close()


def _judge(a, workers: int, pairs, options, matrix: bool):
    res = run_suites(a.target, a.fault, a.seeds, a.junit, suites=a.suite or None, progress=_progress_printer(),
                     device=a.device, workers=workers, pairs=pairs)
    pair = pairs.pair(a.target)  # the main pair as the suites left it; None for ref
    print(file=sys.stderr)
    if res.interrupted:
        code = _stopped(a, res, pair, options)
        return (code, "STOPPED") if matrix else code
    if res.exit_code not in (0, 1):
        print(f"overlap-harness: error: the suites could not run (pytest exit {res.exit_code})", file=sys.stderr)
        return (2, "ERROR") if matrix else 2
    print(format_table(res))
    for line in path_lines(res):
        print(line)
    for line in (invariance_lines(a.target), overlap_line(res) if a.target == "ref" else served_overlap_line(pair),
                 conservation_line(res)):
        if line:
            print(line)
    for line in served_books_lines(pair):
        print(line)
    if release_line(pair):
        print(release_line(pair))
    hangs = served_hangs(pair)
    for h in hangs:  # one finding each; the pair started again and the gate went on with the next case
        print(h["line"] + (f" (case {h['case']})" if h.get("case") else ""))
        print(f"  stacks of {h['stacks']} server process(es) and the agent's last facts: {h['report']}")
        for note in h.get("notes") or ():  # what the engine held, and by whom
            print(f"  {note.strip()}")
    for line in res.hangs[:3]:  # the ref engine's watchdog: what is held and by whom
        print(line)
    if len(res.hangs) > 3:
        print(f"  and {len(res.hangs) - 3} more case(s) ended as HANG")
    crashes = served_crashes(pair)
    for c in crashes:  # one finding each; the pair started again and the gate went on with the next case
        print(c["line"])
        print(f"  the engine's traceback (log {c['log']}):")
        print("\n".join("    " + ln for ln in (c["traceback"] or "none in its log").splitlines()))
    for line in (served_restarts_line(pair), served_left_out_line(pair)):
        if line:
            print(line)
    verdict = "CRASH" if crashes else "HANG" if hangs or res.hangs else ("PASS" if res.ok else "FAIL")
    if a.json:
        _write_json(a, res, verdict, pair, options)
    line = (f"{verdict}: {sum(s.passed for s in res.suites.values())} passed, "
            f"{sum(s.failed for s in res.suites.values())} failed in {res.seconds:.0f} s")
    print(f"\n{line}" + (f"; JUnit XML: {a.junit}" if a.junit else "") + (f"; JSON: {a.json}" if a.json else ""))
    code = 0 if res.ok and not hangs and not crashes else 1
    return (code, line) if matrix else code


class _ConfigDown(Exception):
    """A configuration of the matrix whose servers did not start."""


def UsageError_(matrix: bool):
    return _ConfigDown if matrix else UsageError


def _stopped(a, res, pair, options) -> int:
    """SIGTERM or Ctrl-C ended the suites (harness/stopping.py): what ran and what was found
    before it, printed and written as on a full run; no verdict on the rows that never ran, and
    no run-wide judgement (overlap, invariance) of a run cut short."""
    from harness import stopping
    hangs, crashes = served_hangs(pair), served_crashes(pair)
    print(format_table(res))
    for h in hangs:
        print(h["line"])
        print(f"  stacks of {h['stacks']} server process(es) and the agent's last facts: {h['report']}")
    for line in res.hangs[:3]:
        print(line)
    for c in crashes:
        print(c["line"])
        print(f"  the engine's traceback (log {c['log']})")
    word = stopping.stopped_word().upper()
    ran = sum(s.cases for s in res.suites.values())
    if a.json:
        _write_json(a, res, word, pair, options)
    print(f"\n{word} by {stopping.signal_name()}: {sum(s.passed for s in res.suites.values())} passed, "
          f"{sum(s.failed for s in res.suites.values())} failed, {max(res.collected - ran, 0)} not run, "
          f"in {res.seconds:.0f} s" + (f"; JUnit XML: {a.junit}" if a.junit else "")
          + (f"; JSON: {a.json}" if a.json else ""))
    return stopping.exit_code()


def _write_json(a, res, verdict: str, pair, options) -> None:
    from harness.gate import json_report
    release, adapted = served_release(pair, options.vllm.version)
    obj = json_report.report(res, a.target, verdict, release, adapted, served_hangs(pair), served_crashes(pair))
    if pair is not None and pair.left_out:  # rid -> the known crash whose trigger it was sent without
        obj["left_out"] = {rid: {"known": k, "fields": list(f), "case": c} for rid, (k, f, c) in pair.left_out.items()}
    if pair is not None and pair.name == "vllm":  # the vLLM that ran: read from it and its servers' logs
        b = pair.build
        obj["vllm"] = {"ran": pair.what_ran(), "release": pair.version, "commit": b.commit, "source": b.source,
                       "python": b.python, "compiled_from": b.compiled_from, "by_range": pair.release.by_range,
                       "runner": sorted({r for r, _ in pair.ran.values() if r}) or None, "runner_chosen": pair.runner}
    json_report.write(a.json, obj)


def cmd_mutants(a) -> int:
    from harness.targets import check_fault_names
    check_fault_names(a.target, a.fault, UsageError)
    check_seeds(a.seeds, UsageError)
    vllm = vllm_choice(a, UsageError)
    if a.target != "ref":
        check_out_dir(a.out, UsageError)
    pairs = start_served(a.target, (), UsageError, served_options(a, UsageError, vllm))

    def progress(label):
        print(f"running the suites against: {label}", file=sys.stderr)
    try:
        m = kill_matrix(a.seeds, a.fault or None, progress, a.intended_only, target=a.target, pairs=pairs)
    finally:
        pairs.close()
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
        if hasattr(f, "search"):  # a source patch of the engine (harness.agents.vllm.patches)
            engine = "sglang" if getattr(a, "target", "") == "sglang" else "vllm"
            print(f"{'':22} patch of {engine}/{f.file}" + (f", on the {f.path} path" if getattr(f, "path", "") else ""))
            if getattr(f, "device_only", ""):  # `mutants` lists it and does not run it on vLLM's CPU build
                print(f"{'':22} needs a device: {f.device_only}")
            if getattr(f, "unreachable", ""):  # `mutants` lists it with the reason and does not run it
                print(f"{'':22} {f.unreachable}")
        if f.upstream:  # real bugs of the same class
            print(f"{'':22} upstream: {', '.join(f.upstream)}")
    return 0


def add_commands(sub) -> None:
    from harness.targets import TARGETS
    c = sub.add_parser("check", help="run the suites against a target and print a verdict table")
    c.add_argument("--target", default="ref", choices=TARGETS)
    add_served_flags(c)
    c.add_argument("--fault", action="append", default=[], metavar="NAME", help="inject a fault (repeatable)")
    c.add_argument("--seeds", type=int, default=None, help="seeds per suite case (default: the suite's)")
    c.add_argument("--suite", action="append", default=[], metavar="NAME",
                   help="run only this suite (repeatable; e.g. test_conservation; default: every suite)")
    c.add_argument("--junit", metavar="FILE", help="write JUnit XML")
    c.add_argument("--json", metavar="FILE", help="write the verdict as JSON: every row's status (pass / FAIL "
                   "/ KNOWN UPSTREAM / n/a / not exercised / HANG / CRASH), the release and what was adapted")
    c.add_argument("--device", default="sim", choices=("sim", "cuda"),
                   help="the ref engine's device: sim (default) or cuda (a real GPU; delays spin the GPU)")
    c.add_argument("--configs", metavar="NAME,...|all|all,-NAME,...",
                   help="vllm: run the gate once per server configuration (harness/targets/vllm/configs.py, "
                        "docs/vllm-configs.md), one pair at a time, the path suite unless --suite names others; "
                        "all: the whole matrix, all,-NAME,...: all but those (default: the path setting only); "
                        "sglang: its drafters (harness/targets/sglang/spec.py: ngram)")
    c.add_argument("--workers", type=worker_count, default="auto", metavar="N",
                   help="processes to spread the cases over with pytest-xdist: auto (default: every core) "
                        "or a number; 1 runs them in this process")
    c.set_defaults(fn=cmd_check)
    m = sub.add_parser("mutants", help="run every suite against every fault: the kill matrix")
    m.add_argument("--target", default="ref", choices=TARGETS, help="whose fault catalogue (default: ref)")
    add_served_flags(m)
    m.add_argument("--fault", action="append", default=[], metavar="NAME", help="only these faults")
    m.add_argument("--seeds", type=int, default=None)
    m.add_argument("--intended-only", action="store_true",
                   help="run each fault against the suite that must catch it only (faster)")
    m.add_argument("--json", action="store_true")
    m.set_defaults(fn=cmd_mutants)
    f = sub.add_parser("faults", help="list the fault catalogue")
    f.add_argument("--target", default="ref", choices=TARGETS, help="whose catalogue (default: ref)")
    f.set_defaults(fn=cmd_faults)
