"""The gate over a list of releases: one `check --target vllm --vllm-version V --json FILE` per
release in a subprocess (a release's servers, venv and crashes stay in it), one table release x
row, written as JSON too.

Every release goes through one function, gate_release(version, out_dir) -> ReleaseResult; the
sweep takes it as an argument, so the table, the JSON, the shards and the progress lines are
tested with an injected gate and no vLLM.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness import stopping
from harness.gate import json_report
from harness.releases.stress import StressResult

ROOT = Path(__file__).resolve().parent.parent.parent
UNAVAILABLE = "UNAVAILABLE"  # the release's gate could not run (not installed, servers did not start)
SCHEMA = 1


@dataclass
class ReleaseResult:
    version: str
    verdict: str  # PASS / FAIL / HANG (the gate's), or UNAVAILABLE with `error`
    rows: dict = field(default_factory=dict)  # row -> {"status", "detail"} (harness.gate.json_report.rows)
    seconds: float = 0.0
    exit_code: int = 0
    adapted: list = field(default_factory=list)  # what the agent adapted in this release
    ran: str = ""  # the vLLM that ran: release, commit, runner (from its log), source (check's JSON "vllm")
    error: str = ""  # UNAVAILABLE: the one line saying why
    json_path: str = ""
    log_path: str = ""
    stress: dict | None = None  # the short stress after the gate (harness/releases/stress.py), when run

    @classmethod
    def from_dict(cls, d: dict) -> "ReleaseResult":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def parse_shard(text: str, error=ValueError) -> tuple[int, int]:
    """"I/N" (1 <= I <= N) -> (I, N); one clear error otherwise."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise error(f"--shard expects I/N (e.g. 2/4), got {text!r}") from None
    if n < 1 or not 1 <= i <= n:
        raise error(f"--shard {text}: I must be between 1 and N (N >= 1)")
    return i, n


def shard(versions: list[str], i: int, n: int) -> list[str]:
    """Shard i of n (1-based): every n-th release from the i-th, so each shard spans old and new."""
    return versions[i - 1::n]


def check_command(version: str, json_path: Path, extra=()) -> list[str]:
    """The gate of one release."""
    cmd = [sys.executable, "-m", "harness.cli", "check", "--target", "vllm", "--json", str(json_path)]
    return cmd + ["--vllm-version", version] + list(extra)


def gate_release(version: str, out_dir: Path, extra=(), timeout: float | None = None) -> ReleaseResult:
    """Run the gate against one installed release; its stdout and stderr go to out_dir/<V>.log."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    jp, log = out_dir / f"{version}.json", out_dir / f"{version}.log"
    if jp.exists():
        jp.unlink()  # an old file must not pass for this run's result
    t = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(log, "w", encoding="utf-8") as f:
        p = subprocess.Popen(check_command(version, jp, extra), cwd=str(ROOT), stdout=f,
                             stderr=subprocess.STDOUT, env=env)
        try:
            code = p.wait(timeout)
        except subprocess.TimeoutExpired:
            code = 124
            _end(p)
        except KeyboardInterrupt:
            # SIGTERM or Ctrl-C (harness/stopping.py passed it on as SIGINT): the release's gate
            # stops its servers and writes what it found; wait for that (subprocess.run would
            # give it a quarter of a second, then SIGKILL), and the sweep ends after this release.
            # It has its SIGINT already (the terminal's, or stopping's): a second one could land
            # after its handlers are gone at exit and turn its 130 into death by signal
            code = _end(p, grace=STOP_GRACE_S, ask=False)
    secs = time.perf_counter() - t
    if not jp.is_file():  # the gate never reached its table: say why in one line
        return ReleaseResult(version, UNAVAILABLE, seconds=secs, exit_code=code, log_path=str(log),
                             error=_why(log, code))
    d = json.loads(jp.read_text())
    return ReleaseResult(version, d.get("verdict", "FAIL"), d.get("rows", {}), secs, code,
                         list(d.get("adapted") or ()), ran=(d.get("vllm") or {}).get("ran", ""),
                         json_path=str(jp), log_path=str(log))


STOP_GRACE_S = 90.0  # a gate told to stop: its servers' grace periods, then its table and JSON


def _end(p: subprocess.Popen, grace: float = 10.0, ask: bool = True) -> int:
    """The release's gate ends: asked first (SIGINT, as Ctrl-C would), SIGKILL after `grace` (or at
    a second signal while waiting)."""
    import signal
    return stopping.end_process(p, grace, ask=signal.SIGINT if ask else None)


def _why(log: Path, code: int) -> str:
    if code == 124:
        return "the gate ran past its time limit"
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith("overlap-harness: error:")]
    return (errs[-1] if errs else (lines[-1] if lines else f"exit {code}, no output"))[:300]


def run_sweep(versions: list[str], gate, out_dir: Path, progress=None, stress=None) -> list[ReleaseResult]:
    """gate(version, out_dir) for each release in order, then stress(version, out_dir) (a
    StressResult) when given and the gate could run; progress(line) before and after each."""
    out = []
    for k, v in enumerate(versions, 1):
        if progress:
            progress(f"[{k}/{len(versions)}] vLLM {v}: running the gate ...")
        r = gate(v, out_dir)
        out.append(r)
        if progress:
            progress(f"[{k}/{len(versions)}] vLLM {v}: {summary(r)}")
        if stress is not None and r.verdict != UNAVAILABLE and not stopping.requested():
            if progress:
                progress(f"[{k}/{len(versions)}] vLLM {v}: running the stress ...")
            s = stress(v, out_dir)
            r.stress = s.to_dict()
            if progress:
                progress(f"[{k}/{len(versions)}] vLLM {v}: stress {s.cell()} in {s.seconds:.0f} s"
                         + (f": {s.error}" if s.error else ""))
        if stopping.requested():  # SIGTERM or Ctrl-C during that release: no next one
            break
    return out


def summary(r: ReleaseResult) -> str:
    if r.verdict == UNAVAILABLE:
        return f"{UNAVAILABLE}: {r.error}"
    counts: dict[str, int] = {}
    for row in r.rows.values():
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    parts = [f"{counts[s]} {s}" for s in json_report.STATUSES if counts.get(s)]
    return f"{r.verdict} ({', '.join(parts) or 'no rows'}) in {r.seconds:.0f} s"


# -- the table ------------------------------------------------------------------------------
def cell(row: dict | None) -> str:
    if row is None:
        return "-"
    s = row["status"]
    if s == json_report.KNOWN:
        return f"KNOWN {json_report.known_id(row)}"
    return {json_report.NOT_EXERCISED: "not exercised"}.get(s, s)


def row_names(results: list[ReleaseResult]) -> list[str]:
    """Every row any release has, in the order the releases list them."""
    names: list[str] = []
    for r in results:
        names += [n for n in r.rows if n not in names]
    return names


def format_table(results: list[ReleaseResult]) -> str:
    """Rows down, releases across; then each FAIL / CRASH / HANG / not exercised cell's first
    finding, and each release the gate could not run, with why."""
    names = row_names(results)
    head = ["row"] + [r.version for r in results]
    body = [[n] + [cell(r.rows.get(n)) if r.verdict != UNAVAILABLE else UNAVAILABLE for r in results]
            for n in names]
    stressed = [StressResult.from_dict(r.stress) for r in results]
    if any(stressed):
        body.append(["stress"] + [s.cell() if s else "-" for s in stressed])
    body.append(["verdict"] + [r.verdict for r in results])
    w = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    lines = ["  ".join(x[i].ljust(w[i]) for i in range(len(head))).rstrip() for x in [head] + body]
    lines.insert(1, "-" * len(lines[0]))
    notes = []
    for r in results:
        if r.verdict == UNAVAILABLE:
            notes.append(f"{r.version}: {UNAVAILABLE}: {r.error}")
            continue
        for n in names:
            row = r.rows.get(n)
            if row and row["status"] in (json_report.FAIL, json_report.CRASH, json_report.HANG, json_report.NOT_EXERCISED):
                notes.append(f"{r.version} {n}: {row['status']}: {row['detail'][:200]}")
        s = StressResult.from_dict(r.stress)
        if s and s.status != "pass":
            notes.append(f"{r.version} stress: {s.status}: " + (s.error or "; ".join(
                f"{f['summary'][:160]} (reproducer: {f['repro'] or 'none'})" for f in s.findings)))
        if r.ran:
            notes.append(f"{r.version}: vLLM that ran: {r.ran}")
        if r.adapted:
            notes.append(f"{r.version}: adapted: {'; '.join(r.adapted)}")
    return "\n".join(lines + ([""] + notes if notes else []))


def to_json(results: list[ReleaseResult], shard_of: tuple[int, int] | None = None) -> dict:
    return {"schema": SCHEMA, "shard": list(shard_of) if shard_of else None,
            "releases": [asdict(r) for r in results]}


def load(paths) -> list[ReleaseResult]:
    """The results of one or more sweep JSON files (the shards of a CI matrix), oldest release
    first; a release in two files keeps the later file's result."""
    from harness.targets.vllm.releases import release_key
    by: dict[str, ReleaseResult] = {}
    for p in paths:
        d = json.loads(Path(p).read_text())
        if not isinstance(d, dict) or "releases" not in d:
            raise ValueError(f"{p}: not a sweep JSON file (no \"releases\")")
        for x in d["releases"]:
            by[x["version"]] = ReleaseResult.from_dict(x)
    return [by[v] for v in sorted(by, key=release_key)]


def exit_code(results: list[ReleaseResult]) -> int:
    """0: every release passed (known upstream is not a pass, but not a new failure either: the
    gate says PASS with them), its stress too where it ran; 1: a release failed, crashed or hung,
    or could not run, or its stress found something new or could not run."""
    def stress_ok(r):
        s = StressResult.from_dict(r.stress)
        return s is None or s.status == "pass"
    return 0 if results and all(r.verdict == "PASS" and stress_ok(r) for r in results) else 1
