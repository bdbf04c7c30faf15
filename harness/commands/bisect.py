"""`overlap-harness bisect`: the releases where one gate row, or one reproducer, changes
(harness/releases/bisect.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def reproducer_probe(path: str, out_dir: Path, timeout: float):
    """A probe that runs a fixtures/vllm_upstream reproducer on one release (a subprocess)."""
    from harness.releases.bisect import reproducer_outcome
    from harness.releases.sweep import ROOT

    def probe(version: str) -> str:
        out_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "fixtures.vllm_upstream.reproduce", "--vllm-version", version]
        log = out_dir / f"reproduce-{version}.log"
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with open(log, "w", encoding="utf-8") as err:
            p = subprocess.run(cmd + [str(Path(path).resolve())], cwd=str(ROOT), stdout=subprocess.PIPE,
                               stderr=err, env=env, timeout=timeout, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"vLLM {version}: the reproducer did not run (exit {p.returncode}; see {log})")
        return reproducer_outcome(json.loads(p.stdout))
    return probe


def gate_rows() -> set[str]:
    """The rows `check --json` reports (harness.gate.json_report.row_name): every path of the paths suite, its
    steps and books cases, every other suite."""
    from harness.gate import ROOT, SUITE_DIRS
    from harness.targets.vllm.paths import PATHS
    suites = {f.stem for d in SUITE_DIRS for f in (ROOT / d).glob("test_*.py")}
    return {p.name for p in PATHS} | {"steps", "books_at_idle"} | (suites - {"test_paths"})


def cmd_bisect(a) -> int:
    from harness.commands.sweep import releases_arg
    from harness.flags import UsageError
    from harness.releases import bisect as bi
    from harness.releases import sweep as sw
    from harness.targets.vllm.releases import versions as known_releases
    if a.vllm_python:
        return bisect_commits(a)
    if a.good or a.bad or a.replay:
        raise UsageError("bisect: --good, --bad and --replay bisect a checkout's commits: give --vllm-python too")
    if bool(a.row) == bool(a.reproducer):
        raise UsageError("bisect: give one of --row NAME or --reproducer FILE")
    if a.reproducer and not Path(a.reproducer).is_file():
        raise UsageError(f"bisect: no reproducer file {a.reproducer}")
    if a.row and a.row not in gate_rows():  # bad input is one line before any server starts
        raise UsageError(f"bisect: no gate row {a.row!r}; rows: {', '.join(sorted(gate_rows()))}")
    cache = {}
    if a.sweep:
        if not a.row:
            raise UsageError("bisect: --sweep gives a row's statuses; use it with --row")
        try:
            done = sw.load(a.sweep)
        except (OSError, ValueError) as e:
            raise UsageError(f"bisect --sweep: {e}") from None
        cache = bi.outcomes_from(done, a.row)
    if a.sweep and not a.releases:  # the sweep's releases, with whatever is installed besides
        from harness.targets.vllm.releases import installed
        from harness.targets.vllm.releases import release_key
        versions = sorted(set(cache) | set(installed()), key=release_key)
    else:
        versions = releases_arg(a.releases, UsageError)
    if len(versions) < 2:
        raise UsageError(f"bisect needs two releases or more; have {', '.join(versions) or 'none'} "
                         "(`overlap-harness setup vllm --version V` installs one)")
    out = Path(a.out)
    if a.row:
        def gate(v, out_dir):
            print(f"bisect: vLLM {v}: running the gate ...", file=sys.stderr, flush=True)
            return sw.gate_release(v, out_dir, timeout=a.timeout)
        probe, subject = bi.row_probe(gate, a.row, out), f"row {a.row}"
    else:
        probe, subject = reproducer_probe(a.reproducer, out, a.timeout), f"reproducer {a.reproducer}"
    try:
        res = bi.bisect(versions, probe, known=known_releases(), cache=cache)
    except RuntimeError as e:
        raise UsageError(f"bisect: {e}") from None
    res.subject = subject
    for line in res.lines():
        print(line)
    return 0


def bisect_commits(a) -> int:
    """--vllm-python: git bisect over the commits of the checkout that Python's vLLM comes from
    (harness.releases.commits), each step a `replay --vllm-python` (exit 0 / 1 / 125)."""
    from harness.flags import UsageError
    from harness.releases import commits
    from harness.targets.vllm import build as vllm_build
    if a.row or a.reproducer or a.releases or a.sweep:
        raise UsageError("bisect --vllm-python bisects one checkout's commits with --replay FILE: --row, "
                         "--reproducer, --releases and --sweep search installed releases instead")
    if not (a.good and a.bad and a.replay):
        raise UsageError("bisect --vllm-python needs --good REV, --bad REV and --replay FILE (a stress repro.json)")
    if not Path(a.replay).is_file():
        raise UsageError(f"bisect: no reproducer file {a.replay}")
    try:
        build = vllm_build.user_build(a.vllm_python)
        top = commits.checkout_of(build)
        first, tail = commits.bisect(top, a.good, a.bad, commits.replay_command(a.replay, build.python, a.vllm_runner),
                                     timeout=a.timeout * 64)
    except ValueError as e:
        raise UsageError(f"bisect: {e}") from None
    print(tail)
    if not first:
        print(f"bisect: git bisect found no first bad commit between {a.good} and {a.bad} in {top}")
        return 1
    print(f"bisect: the reproducer first fails at {first} in {top} (vLLM from {build.python})")
    return 0


def add_commands(sub) -> None:
    b = sub.add_parser("bisect", help="the last release where a gate row or a reproducer passes and the first "
                       "where it fails (and where it was fixed)")
    b.add_argument("--row", metavar="NAME", help="a row of the gate (a path such as penalties, steps, or a suite)")
    b.add_argument("--reproducer", metavar="FILE", help="a reproducer in fixtures/vllm_upstream/ format: fails "
                   "where a server dies, the arms' outputs differ or its `fails_when` counters count")
    b.add_argument("--releases", metavar="V,V,...", help="releases to search (default: every installed one)")
    b.add_argument("--sweep", nargs="+", metavar="FILE", help="sweep JSON whose results stand for gate runs "
                   "(no release is gated twice)")
    b.add_argument("--out", default="out/bisect", metavar="DIR", help="logs of the runs (default: out/bisect)")
    b.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="seconds per release (default: 1800)")
    b.add_argument("--vllm-python", metavar="PATH", help="bisect the commits of the git checkout this Python's "
                   "vLLM is imported from (an editable install) with --good, --bad and --replay; each step is "
                   "`replay --vllm-python` (exit 0 good / 1 bad / 125 cannot test)")
    b.add_argument("--vllm-runner", default="auto", choices=("auto", "v1", "v2"),
                   help="with --vllm-python: the model runner each step attacks (default auto)")
    b.add_argument("--good", metavar="REV", help="with --vllm-python: a commit where the reproducer passes")
    b.add_argument("--bad", metavar="REV", help="with --vllm-python: a commit where it fails")
    b.add_argument("--replay", metavar="FILE", help="with --vllm-python: a repro.json written by `stress`")
    b.set_defaults(fn=cmd_bisect)
