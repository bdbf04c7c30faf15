"""The gate: the suites run in-process against a target, a verdict per suite; the kill matrix.

`overlap-harness check` (the gate) and `overlap-harness mutants` (the kill matrix).

Both run the pytest suites in-process, so the model and torch load once, and read each
case's outcome through a small collector plugin.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness import stopping
from harness.gate.session import old_objects_frozen, xdist_args
from harness.verdict import Status

PASS, FAIL, KNOWN, NA, NOT_EXERCISED, HANG, SKIPPED = (Status.PASS, Status.FAIL, Status.KNOWN, Status.NA,
                                                      Status.NOT_EXERCISED, Status.HANG, Status.SKIPPED)

ROOT = Path(__file__).resolve().parents[2]  # the checkout: this file is harness/gate/__init__.py
SUITE_DIRS = ("races", "equivalence", "evals")


@dataclass
class SuiteResult:
    suite: str
    cases: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    first_failure: str = ""
    first_step: int | None = None
    seconds: float = 0.0  # setup to teardown of its cases (a module fixture's run counts in its first case)


@dataclass
class GateResult:
    suites: dict[str, SuiteResult] = field(default_factory=dict)
    exit_code: int = 0
    seconds: float = 0.0
    paths: list = field(default_factory=list)  # "row=on/off": how often each attacked path ran
    path_overlap: list = field(default_factory=list)  # "row=overlapped/judged": its waits, async on
    pairs: list = field(default_factory=list)  # "a x b=on/off": requests that met both features (races/test_combos)
    known: list = field(default_factory=list)  # "KNOWN UPSTREAM id: finding" (reported, never a pass)
    known_gone: list = field(default_factory=list)  # known upstream ids that did not reproduce
    claims: list = field(default_factory=list)  # "case: id: held|refuted|not tested" (harness.gate.claims)
    installed: list = field(default_factory=list)  # "name = module:attr": the target's vllm.logits_processors
    fitted: list = field(default_factory=list)  # a parameter row's inputs fitted to the model (harness.targets.vllm.acting)
    spec: list = field(default_factory=list)  # a drafter's windows per arm: acceptance, accepted lengths (test_paths)
    hangs: list = field(default_factory=list)  # "HANG: ..." of the ref engine's watchdog (its cases failed)
    na: list = field(default_factory=list)  # "n/a in V: ...": a row whose feature the release lacks
    # "not exercised: why": what a target declares it cannot compare (SGLang's unseeded sampling):
    # skipped cases, and the requests a judged case left out; never counted as passes
    not_exercised: list = field(default_factory=list)
    cases: list = field(default_factory=list)  # one dict per case, in collection order (harness.gate.json_report)
    collected: int = 0  # cases collected: those past the recorded ones never ran (an interrupted run)
    interrupted: bool = False  # SIGTERM or Ctrl-C ended the session (harness/stopping.py)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and all(s.failed == 0 for s in self.suites.values())


class _Collector:
    """Each case's outcome. Under pytest-xdist the cases finish in any order, so the table is
    built afterwards in collection order: the same suites, counts and first findings as a run
    in one process. It also times each case (setup to teardown) and, under xdist, hands the
    cases to the workers longest first (`_longest_first`)."""

    def __init__(self, progress, durations: dict | None = None):
        self.progress = progress
        self.order: dict[str, int] = {}  # node id -> position in collection order
        self.records: list[tuple] = []  # (node id, suite, outcome, message, first step, status)
        self.cases: list[dict] = []  # case_record per case, for `check --json`
        self.extra: list[tuple] = []  # (node id, key, value): path counts, known upstream
        self.known = durations or {}  # node id -> seconds, from earlier runs
        self.durations: dict[str, float] = {}  # node id -> seconds, this run

    @pytest.hookimpl(optionalhook=True, tryfirst=True)  # ahead of xdist's own (the first answer counts)
    def pytest_xdist_make_scheduler(self, config, log):
        return _longest_first(config, log, _case_cost(self.known))

    def pytest_collection_finish(self, session):  # in one process
        self.order = self.order or {item.nodeid: i for i, item in enumerate(session.items)}

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):  # each worker collects the same list
        self.order = self.order or {nid: i for i, nid in enumerate(ids)}

    def pytest_runtest_logreport(self, report):
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration
        if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
            return
        suite = Path(str(report.fspath)).stem
        for k, v in report.user_properties:
            if k in ("path_count", "path_overlap", "known_gone", "installed", "not_exercised", "pairs_met", "spec",
                     "claim_test", "fitted"):
                self.extra.append((report.nodeid, k, v))
        outcome = "passed" if report.passed else ("skipped" if report.skipped else "failed")
        msg, step = ("", None) if outcome != "failed" else (
            _message(report), dict(report.user_properties).get("first_step"))
        case = case_record(report, suite, outcome, msg)
        # what the gate lists apart, by the case's status and finding code (harness.verdict)
        if case["status"] == KNOWN:
            self.extra.append((report.nodeid, "known", report.wasxfail))
        elif case["status"] == NA and case["finding"] == "row.absent":
            self.extra.append((report.nodeid, "na", case["detail"]))
        elif case["status"] == NOT_EXERCISED and outcome == "skipped":
            self.extra.append((report.nodeid, "not_exercised", f"{report.nodeid.split('::')[-1]}: {case['detail']}"))
        self.records.append((report.nodeid, suite, outcome, msg, step, case["status"]))
        self.cases.append(case)
        if self.progress:
            self.progress(suite, report)

    @property
    def res(self) -> GateResult:
        res = GateResult()
        last = len(self.order)
        ranked = sorted(enumerate(self.records), key=lambda r: (self.order.get(r[1][0], last), r[0]))
        for _, (_, suite, outcome, msg, step, status) in ranked:
            s = res.suites.setdefault(suite, SuiteResult(suite))
            s.cases += 1
            setattr(s, outcome, getattr(s, outcome) + 1)
            if outcome == "failed" and not s.first_failure:
                s.first_failure, s.first_step = msg, step
            if status == HANG and msg not in res.hangs:
                res.hangs.append(msg)
        for nid, sec in self.durations.items():  # where a gate's time goes (the sweep's 6-minute goal)
            s = res.suites.get(Path(nid.split("::")[0]).stem)
            if s is not None:
                s.seconds += sec
        res.cases = sorted(self.cases, key=lambda c: self.order.get(c["id"], last))
        res.collected = len(self.order)
        slot = {"path_count": res.paths, "path_overlap": res.path_overlap, "pairs_met": res.pairs, "known": res.known,
                "known_gone": res.known_gone, "installed": res.installed, "na": res.na,
                "not_exercised": res.not_exercised, "spec": res.spec, "claim_test": res.claims, "fitted": res.fitted}
        for nid, k, v in sorted(self.extra, key=lambda e: self.order.get(e[0], last)):
            if v not in slot[k]:
                slot[k].append(v)
        return res


# -- spreading the cases over workers --------------------------------------------------------
def _durations_file() -> Path:
    from harness.cache import cache_root
    return cache_root() / "check-durations.json"


def load_durations() -> dict[str, float]:
    """Seconds per case (node id) from earlier runs against the correct ref engine; {} if none."""
    try:
        d = json.loads(_durations_file().read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in d.items() if isinstance(v, (int, float))} if isinstance(d, dict) else {}


def save_durations(new: dict[str, float]) -> None:
    """Merge this run's case times into the file (written whole, then renamed: runs may overlap)."""
    if not new:
        return
    path = _durations_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = {**load_durations(), **{k: round(v, 3) for k, v in new.items()}}
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(merged, indent=0, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # only a scheduling hint: a read-only cache costs speed, never the verdict


def _case_cost(known: dict[str, float]):
    """A case's expected seconds: its last time here; never timed: the evals suite's cases (a
    whole benchmark each, the longest by far) first, any other the typical case."""
    times = sorted(known.values())
    typical = times[len(times) // 2] if times else 0.0

    def cost(nodeid: str) -> float:
        t = known.get(nodeid)
        if t is not None:
            return t
        return float("inf") if nodeid.startswith("evals/") else typical
    return cost


def _longest_first(config, log, cost):
    """pytest-xdist's load scheduling, handing the cases out longest first, one at a time. In
    collection order the longest case (the GSM8K gate) came last and ran alone while the other
    worker idled; longest first, the last cases to finish are short ones."""
    from xdist.scheduler import LoadScheduling

    class LongestFirst(LoadScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.maxschedchunk = 1  # each worker holds its running case and one more

        def _send_tests(self, node, num: int) -> None:
            c = self.collection
            self.pending.sort(key=lambda i: -cost(c[i]))  # stable: ties keep collection order
            super()._send_tests(node, num)
    return LongestFirst(config, log)


class _GivePairs:
    """Hands the run's Pairs to the plugin's fixtures (harness.plugin.give_pairs)."""

    def __init__(self, pairs):
        self.pairs = pairs

    def pytest_configure(self, config):
        from harness.plugin import give_pairs
        give_pairs(config, self.pairs)


def case_record(report, suite: str, outcome: str, msg: str) -> dict:
    """One case as `check --json` writes it: its status (harness.verdict.Status), the finding code
    and the detail line, from the status and code the plugin put on its report (harness.plugin)."""
    props = dict(report.user_properties)
    status = props.get("status") or {"passed": PASS, "failed": FAIL}.get(outcome, SKIPPED)
    if status == PASS:
        detail = ""
    elif outcome == "failed":
        detail = msg.removeprefix("Failed: ")
    elif status == KNOWN:  # "<id>: <finding>": the id from the data, the words as the suite gave them
        kid = props.get("known_id", "")
        detail = f"{kid}: " + report.wasxfail.removeprefix(f"KNOWN UPSTREAM {kid}:").strip()
    else:
        detail = getattr(report, "wasxfail", "") or _skip_reason(report)
    return {"id": report.nodeid, "suite": suite, "status": str(status), "finding": props.get("finding", ""),
            "known": props.get("known_id", ""), "detail": detail}


def _skip_reason(report) -> str:
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:  # (file, line, "Skipped: why")
        return str(lr[2]).removeprefix("Skipped: ")
    return str(lr or "")


def _message(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    msg = crash.message if crash is not None else str(report.longrepr)
    line = msg.strip().splitlines()[0] if msg.strip() else "failed"
    if "HANG: " in line and not line.startswith("HANG"):  # the ref engine's watchdog, its class name first
        line = line[line.index("HANG: "):]
    return line.removeprefix("AssertionError: ")


def suite_names() -> list[str]:
    """Every suite by name (its file's stem), in the order the folders list them."""
    return [f.stem for sd in SUITE_DIRS for f in sorted((ROOT / sd).glob("test_*.py"))]


def suite_paths(names=None) -> list[str]:
    """Suite folders, or single suites by name (e.g. "test_fence_placement")."""
    out = []
    for d in names or SUITE_DIRS:
        if d.startswith("test_"):
            out += [str(f) for sd in SUITE_DIRS for f in (ROOT / sd).glob(f"{d}.py")]
            continue
        p = ROOT / d
        if p.is_dir() and any(p.glob("test_*.py")):
            out.append(str(p))
    return out


def run_suites(target: str = "ref", faults=(), seeds: int | None = None, junit: str | None = None,
               suites=None, progress=None, quiet: bool = True, device: str = "sim", workers=1,
               keyword: str | None = None, pairs=None, maxfail: int | None = None) -> GateResult:
    """`keyword`: only the cases pytest's -k selects (a suite's module fixtures run only for them).
    `maxfail`: stop after that many failed cases (pytest's --maxfail; the cases after it are not run).
    `pairs`: the run's served pairs (harness.targets.Pairs), which the suites get through the
    plugin (harness.plugin); None: the session makes and closes its own."""
    xd = xdist_args(workers)
    args = suite_paths(suites) + ["-p", "no:cacheprovider", "-q", "--tb=no", "-rN", "--rootdir", str(ROOT),
                                  "--oh-target", target, "--oh-device", device] + xd
    if keyword:
        args += ["-k", keyword]
    if maxfail:
        args += ["--maxfail", str(maxfail)]
    for f in faults:
        args += ["--oh-fault", f]
    if seeds:
        args += ["--oh-seeds", str(seeds)]
    if junit:
        args += ["--junitxml", junit]
    timed = target == "ref" and not faults and not seeds and device == "sim"  # times that predict a check's
    col = _Collector(progress, load_durations() if xd and timed else None)
    t = time.perf_counter()
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink) if quiet else contextlib.nullcontext(), old_objects_frozen():
        code = pytest.main(args, plugins=[col] + ([_GivePairs(pairs)] if pairs is not None else []))
    if timed and code in (0, 1):
        save_durations(col.durations)
    res = col.res
    res.exit_code = int(code)
    res.interrupted = code == pytest.ExitCode.INTERRUPTED or stopping.requested()
    res.seconds = time.perf_counter() - t
    if code not in (0, 1) and quiet and not res.interrupted:  # a collection or usage error: show what pytest said
        sys.stderr.write(sink.getvalue()[-2000:])
    return res


# -- check ----------------------------------------------------------------------------
def start_served(target: str, faults, exc, options=None):
    """The run's Pairs (harness.targets.Pairs), created here and closed by the caller at the run's
    end. A served target (a real engine) is started before the suites run, so a missing setup or
    a server that cannot start is one line and exit 2, not an error in every suite."""
    from harness.targets import Pairs, ServedOptions
    options = options or ServedOptions()
    if options.logits_processors and target != "vllm":
        raise exc(f"--logits-processor is for --target vllm (its vllm.logits_processors entry points), not {target}")
    if options.logits_processors:  # a malformed one is one line before any server starts
        from harness.targets.vllm.target import parse_entry_points
        parse_entry_points(options.logits_processors, exc)
    pairs = Pairs({target: options})
    if target == "ref":
        return pairs
    from harness.targets.base import TargetError, TargetUnavailable
    print(f"starting the {target} servers (overlap on and off) ...", file=sys.stderr, flush=True)
    t = time.perf_counter()
    try:
        pairs.get(target, frozenset(faults)).start()
    except (TargetUnavailable, TargetError) as e:
        pairs.close()
        raise exc(f"target {target}: {e}") from None
    print(f"servers ready in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    return pairs


def format_table(res: GateResult) -> str:
    rows = [("suite", "cases", "passed", "failed", "first finding")]
    for s in res.suites.values():
        finding = s.first_failure[:110] if s.failed else ("skipped" if s.skipped == s.cases else "")
        rows.append((s.suite, str(s.cases), str(s.passed), str(s.failed), finding))
    w = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(r[i].ljust(w[i]) for i in range(4)) + "  " + r[4] for r in rows]
    lines.insert(1, "-" * min(120, max(len(x) for x in lines)))
    return "\n".join(lines)


def path_lines(res: GateResult) -> list[str]:
    """How often each attacked path ran (async on / off), and the known upstream bugs: reported
    apart from new failures, never as a pass; one that stopped reproducing is said too."""
    out = []
    if res.paths:
        out.append("paths exercised (count async on/off): " + ", ".join(p.replace("=", " ") for p in res.paths))
    if res.pairs:
        out.append("pairs met (requests, overlap on/off): " + ", ".join(p.replace("=", " ") for p in res.pairs))
    if res.path_overlap:
        out.append("overlap per path (waits overlapped of judged, async on): "
                   + ", ".join(p.replace("=", " ") for p in res.path_overlap))
    if res.installed:
        out.append("logits processors installed in the target (vllm.logits_processors, each run async on vs off "
                   "with the placeholder repair on and off): " + ", ".join(res.installed))
    # a row's inputs changed to act on the model served (one built for SmolLM2 acts as built: not listed)
    out += [x for x in res.fitted if not x.endswith(" as built")]
    out += [f"speculative windows: {x}" for x in res.spec]
    out += [k for k in res.known]
    out += [f"known upstream {k}: no longer reproduces" for k in res.known_gone]
    from harness.gate import claims as gate_claims
    out += [x for x in (gate_claims.line(res.claims),) if x]
    out += list(res.na)  # neither a pass nor "not exercised": the release has no such path
    out += list(res.not_exercised)  # what the target declared it cannot compare: not a pass
    return out


def overlap_line(res: GateResult) -> str:
    """"overlap: effective / LOST", from the suite that judges it (races/test_overlap_effective)."""
    s = res.suites.get("test_overlap_effective")
    if s is None or s.cases == 0:
        return ""
    if s.failed:
        msg = s.first_failure.removeprefix("Failed: ")  # pytest.fail's prefix
        return msg if msg.startswith("overlap: LOST") else f"overlap: LOST: {msg}"
    return "overlap: effective" if s.passed else "overlap: not judged (skipped)"


def conservation_line(res: GateResult) -> str:
    """"conservation: ...", from the suite that reads the ref engine's books (races/test_conservation)."""
    s = res.suites.get("test_conservation")
    if s is None or s.cases == 0 or s.skipped == s.cases:
        return ""
    if s.failed:
        return f"conservation: LEAK: {s.first_failure}"
    return (f"conservation: every resource accounted for after every step and back at idle "
            f"({s.passed} paths, overlap on and off)")


def invariance_lines(target: str) -> str:
    """The ref engine's batch invariance as measured here, and, where it is not verified, how
    the suites judged it (as a real engine: tie or race)."""
    if target != "ref":
        return ""
    from harness.oracles.reference import INEXACT
    from harness.targets import make_target
    inv = make_target("ref").invariance
    return inv.line if inv.ok else f"{inv.line}\n{INEXACT}"


def served_overlap_line(pair) -> str:
    """A served target's overlap (`pair`: the run's main pair, None for ref), from what its agent
    saw (checked after every run already)."""
    return pair.overlap_summary() if pair is not None else ""


def served_books_lines(pair) -> list[str]:
    """Both arms' books at idle (harness.oracles.books), read as the gate ends: what each engine
    still holds after every suite ran on it."""
    if pair is None:
        return []
    from harness.oracles import books
    out = []
    for overlap in (True, False):
        arm = "on" if overlap else "off"
        if overlap in pair.hung:
            out.append(f"books at idle (async {arm}): not read (the server hung)")
        elif overlap in pair.servers:
            bk = pair.idle_books(overlap)
            # SGLang's books are its own idle checks (SglangTarget.books_line); vLLM's, the agent's
            out.append(pair.books_line(bk, arm) if pair.name == "sglang" else books.line(bk, arm))
    return out


def served_crashes(pair) -> list[dict]:
    """The servers that died under a run: {"line", "traceback", "log"} each."""
    return list(pair.crashes) if pair is not None else []


def release_line(pair) -> str:
    """The vLLM release in force and what was adapted to run it here (a vLLM pair; "" for others)."""
    if pair is None or pair.name != "vllm":
        return ""
    ad = pair.adaptations()
    return f"vLLM that ran: {pair.what_ran()}" + (
        "\nadapted: " + "; ".join(ad) if ad else "\nadapted: nothing (run as installed)")


def served_release(pair, asked: str | None = None) -> tuple[str | None, list[str]]:
    """(the engine release the suites ran against, what the agent adapted there): the release
    asked for, else the one the vLLM pair ran (Target.version); (None, []) for ref and SGLang."""
    if pair is None or pair.name != "vllm":
        return asked, []
    return asked or pair.version, [str(x) for x in pair.adaptations()]


def served_restarts_line(pair) -> str:
    """How often the pair started again after a death, and whether it was given up (issue 36)."""
    n, gone = (pair.restarts, pair.given_up) if pair is not None else (0, "")
    if not n and not gone:
        return ""
    return (f"the server pair started again {n} time(s) after a death; every later case was judged"
            if not gone else f"the server pair started again {n} time(s) after a death, then not again: {gone}")


def served_left_out_line(pair) -> str:
    """What the pair stopped sending after a known bug killed its async-on engine (issue 36)."""
    proven = type(pair).proven_crashes if pair is not None else {}
    if not proven:
        return ""
    gone = pair.left_out
    return "; ".join(
        f"left out after KNOWN UPSTREAM {kid} killed the async-on engine ({case}): "
        f"{', '.join(f for f, _ in trig)} from {sum(v[0] == kid for v in gone.values())} request(s) since, "
        f"both arms; the rows that attack them say KNOWN UPSTREAM" for kid, (case, trig) in proven.items())


def served_hangs(pair) -> list[dict]:
    """The runs the progress watchdog ended as HANG: {"line", "report", "stacks"} each."""
    return list(pair.hangs) if pair is not None else []


# -- mutants ----------------------------------------------------------------------------
