"""`overlap-harness stress` and `overlap-harness replay`.

stress explores cases (engine switches x schedule policy x workload, drawn by hypothesis from
`harness.workloads.strategies`) against the ref engine until its time is spent. A case fails when

- the access tracker reports a hazard (decided by happens-before from program order, so it
  fires whatever the schedule: the fast detector for ordering faults), or
- its tokens under overlap and the case's schedule policy differ from the reference run of
  the same workload: the same engine switches without any fault, overlap off, serial
  (what the tokens must be), or
- the engine raises.

The first failure is shrunk by hypothesis to a minimal case that fails the same way, and
written as a JSON reproducer with a Chrome trace and a PNG timeline around the failing step.
`replay` runs a reproducer again, bit for bit (the simulated device is deterministic).

`--target vllm` / `--target openai` search a served pair instead (harness/commands/stress_served.py,
harness/search/served_*.py; docs/stress.md).
"""
from __future__ import annotations

import argparse
import sys
import time

from harness.search.case import DETECT, DoesNotFit
from harness.search.explore import Stress, parse_shard
from harness.search.reproducer import (ReproError, ReproUnavailable, check_writable, load_reproducer, replay, timeline,
    write_artifacts)
from harness.search.signals import sigterm_as_interrupt, sigterm_deferred
from harness.workloads.strategies import POLICY_KINDS

EXIT_FOUND, EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 130, 143  # 128 + SIGINT / SIGTERM


def _progress_printer(stream=sys.stderr):
    tty = hasattr(stream, "isatty") and stream.isatty()
    last = [0.0, ""]

    def show(s: Stress, final: bool) -> None:
        # a new phase shows at once: the first shrinking line came up to 5 s late in a log, often
        # after shrinking had ended (a SIGTERM test waited for it over up to five searches)
        now = time.monotonic()
        if not final and now - last[0] < (0.2 if tty else 5.0) and s.phase == last[1]:
            return
        last[0], last[1] = now, s.phase
        line = s.status_line()
        if tty:
            stream.write("\r\033[K" + line + ("\n" if final else ""))
        else:
            stream.write(line + "\n")
        stream.flush()
    return show


class BadInput(Exception):
    """A one-line error, exit code 2 (kept here: under `python -m harness.cli` the module
    harness.cli is loaded twice, so its UsageError class would not be the one main() catches)."""


def _usage(msg: str):
    return BadInput(msg)


def _one_line_errors(fn):
    def wrapped(a) -> int:
        try:
            return fn(a)
        except BadInput as e:
            print(f"overlap-harness: error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
    wrapped.__name__ = fn.__name__
    return wrapped


def cmd_stress(a) -> int:
    if a.target != "ref":  # a served pair: harness/commands/stress_served.py
        from harness.commands.stress_served import cmd_stress_served
        with sigterm_as_interrupt() as term:
            return cmd_stress_served(a, _usage, term)
    for flag in ("vllm_version", "vllm_python", "url", "url_off", "served_model", "tokenizer", "configs"):
        if getattr(a, flag, None) is not None:
            raise _usage(f"--{flag.replace('_', '-')} applies to a served target (--target vllm or openai)")
    from harness.faults import CATALOGUE, check_names
    check_names(a.fault, BadInput)
    if not 0 < a.minutes < float("inf"):
        raise _usage(f"--minutes must be a positive number, got {a.minutes:g}")
    if not 0 <= a.shrink_seconds < float("inf"):
        raise _usage(f"--shrink-seconds must be a number >= 0, got {a.shrink_seconds:g}")
    kinds = tuple(k.strip() for k in a.policies.split(",") if k.strip())
    bad = [k for k in kinds if k not in POLICY_KINDS]
    if bad or not kinds:
        raise _usage(f"bad --policies {a.policies!r}: expected a comma list of {', '.join(POLICY_KINDS)}")
    for name, v, hi in (("--max-requests", a.max_requests, 64), ("--max-running", a.max_running, 256)):
        if not 1 <= v <= hi:  # a workload hypothesis can draw and shrink in seconds
            raise _usage(f"{name} must be between 1 and {hi}, got {v}")
    try:
        check_writable(a.out)
    except OSError as e:
        raise _usage(f"cannot write --out {a.out}: {e.strerror or e}") from None
    from harness.engine.build import ModelUnavailable, load_model  # torch: after the flags' checks
    try:
        load_model(a.model)
    except ModelUnavailable as e:
        raise _usage(str(e)) from None
    if a.spec == "on":
        from harness.workloads.strategies import drafters
        if not drafters(a.model):
            raise _usage("--spec on: this engine has no speculative decoding")
    try:
        shard = parse_shard(a.shard)
    except ValueError as e:
        raise _usage(str(e)) from None
    faults = frozenset(a.fault)
    ordering = [f for f in faults if not CATALOGUE[f].ordering]
    print(f"overlap-harness stress: seed {a.seed}" + (f", shard {a.shard}" if shard[1] > 1 else "")
          + f", {a.minutes:g} min, faults "
          f"{', '.join(sorted(faults)) or 'none'}, policies {','.join(kinds)}, detect {a.detect}, out {a.out}"
          + (f" (not ordering faults: {', '.join(ordering)}; only their tokens can show them)" if ordering else ""),
          file=sys.stderr)
    s = Stress(seconds=a.minutes * 60, seed=a.seed, faults=faults, detect=a.detect, kinds=kinds,
               shrink=a.shrink, shrink_seconds=a.shrink_seconds, max_requests=a.max_requests,
               max_running=a.max_running, model=a.model, spec={"both": None, "off": False, "on": True}[a.spec],
               progress=_progress_printer(), shard=shard)
    with sigterm_as_interrupt() as term:  # CI cancellations and `timeout` send SIGTERM: keep what was found
        try:
            res = s.run()
        except KeyboardInterrupt:  # came after the search's own handling (while it wrapped up)
            s.res.interrupted = True
            res = s.res
        with sigterm_deferred():  # from here on a SIGTERM must not cost what was found
            return _report(a, res, term, faults)


def _report(a, res, term, faults) -> int:
    code = EXIT_TERMINATED if term else EXIT_INTERRUPTED
    r = res
    print(f"{r.runs} schedules in {r.explore_s + r.shrink_s:.1f} s ({r.runs / max(r.explore_s + r.shrink_s, 1e-9):.1f}/s)"
          f"; hazards {r.hazards}, divergences {r.divergences}, violations {r.violations}, crashes {r.crashes}",
          file=sys.stderr)
    if not res.failed:
        print(f"{'terminated' if term else 'interrupted'}: nothing found so far" if res.interrupted else
              f"PASS: no hazard, divergence or crash in {r.runs} schedules", file=sys.stdout)
        return code if res.interrupted else 0
    case, failure = res.best
    paths = write_artifacts(a.out, case, failure, faults=faults, seed=a.seed, model=a.model, detect=a.detect)
    first_case = res.first[0]
    print(f"FAIL: {failure.kind}: {failure.summary}")
    print(f"found after {r.first_found_s:.1f} s with {len(first_case.requests)} requests; shrunk to "
          f"{len(case.requests)} request(s), policy {case.policy}, engine {case.engine} in {r.shrink_runs} tries"
          + (" (shrinking interrupted)" if res.interrupted else ""))
    print(failure.detail)
    print(f"reproducer: {paths['repro']}")
    if "png" in paths:
        print(f"timeline:   {paths['png']} (PNG), {paths['trace']} (Chrome trace: open in Perfetto)")
    else:
        print(f"timeline:   none ({paths.get('timeline_error')})")
    print(f"replay:     overlap-harness replay {paths['repro']}")
    return code if res.interrupted else EXIT_FOUND


def cmd_replay(a) -> int:
    if a.target != "ref":
        from harness.commands.stress_served import cmd_replay_served
        return cmd_replay_served(a, _usage)
    try:
        d = load_reproducer(a.file)
    except ReproUnavailable as e:
        raise _usage(str(e)) from None
    except ReproError as e:  # exit 2; a reproducer that runs and fails, or crashes the engine, is exit 1
        raise _usage(f"bad reproducer: {e}") from None
    if a.timeline:
        try:
            check_writable(a.timeline)
        except OSError as e:
            raise _usage(f"cannot write --timeline {a.timeline}: {e.strerror or e}") from None
    case = d["case"]
    rec = d.get("failure") or {}
    print(f"replaying {a.file}: {len(case.requests)} request(s), policy {case.policy}, faults "
          f"{', '.join(sorted(d['faults'])) or 'none'}, seed {d.get('seed', 0)}", file=sys.stderr)
    try:
        f = replay(d)
    except DoesNotFit as e:
        raise _usage(f"bad reproducer: {a.file}: incompatible reproducer ({e})") from None
    if a.timeline and f is not None:
        paths = timeline(a.timeline, case, f, faults=d["faults"], seed=d.get("seed", 0),
                         model=case.engine.get("model", "tiny"))
        print(f"timeline: {paths['png']}, {paths['trace']}", file=sys.stderr)
    if f is None:
        print(f"no longer fails (recorded: {rec.get('kind', '?')}: {rec.get('summary', '?')})")
        return 0
    same = list(f.signature) == list(rec.get("signature", [])) and f.summary == rec.get("summary")
    print(f"still fails{'' if same else ' (differently from the recorded failure)'}: {f.kind}: {f.summary}")
    print(f.detail)
    return EXIT_FOUND


def add_commands(sub) -> None:
    from harness.engine.config import MODELS
    s = sub.add_parser("stress", help="explore workloads x schedule policies; shrink and save the first failure")
    s.add_argument("--minutes", type=float, default=1.0, help="time to explore (default 1)")
    s.add_argument("--seed", type=int, default=0, help="drives the search and the engine (default 0)")
    s.add_argument("--shard", default="0/1", metavar="I/N",
                   help="explore shard I of N: a disjoint slice of the seed's search bursts, so N jobs "
                        "(a CI matrix) cover N times the schedules (default 0/1: all of them)")
    s.add_argument("--fault", action="append", default=[], metavar="NAME", help="inject a fault (repeatable)")
    s.add_argument("--out", default="stress-out", metavar="DIR",
                   help="where a failure's reproducer, trace and PNG go (default stress-out)")
    s.add_argument("--model", default="tiny", choices=MODELS, help="weights to serve (default tiny)")
    s.add_argument("--policies", default=",".join(POLICY_KINDS),
                   help=f"schedule policies to explore, comma list (default {','.join(POLICY_KINDS)})")
    s.add_argument("--detect", default="all", choices=DETECT,
                   help="failures that count: hazards, token divergences, or all (default)")
    s.add_argument("--shrink", action=argparse.BooleanOptionalAction, default=True,
                   help="shrink the first failure to a minimal case (default on)")
    s.add_argument("--shrink-seconds", type=float, default=60.0, help="time limit for shrinking (default 60)")
    s.add_argument("--max-requests", type=int, default=6, help="requests per explored workload (default 6)")
    s.add_argument("--max-running", type=int, default=4, help="largest max_running explored (default 4)")
    s.add_argument("--spec", default="both", choices=("both", "off", "on"),
                   help="explore plain decoding, speculative decoding, or both (default)")
    from harness.commands.stress_served import add_flags
    add_flags(s)
    s.set_defaults(fn=_one_line_errors(cmd_stress))
    r = sub.add_parser("replay", help="run a stress reproducer again and say whether it still fails")
    r.add_argument("file", help="a repro.json written by `overlap-harness stress`")
    r.add_argument("--timeline", metavar="DIR", help="also write the trace and PNG of the replay into DIR")
    r.add_argument("--target", default="ref", choices=("ref", "vllm", "sglang", "openai"),
                   help="the target the reproducer was found on (default ref; vllm/openai: a served reproducer)")
    r.add_argument("--vllm-version", metavar="V", help="vllm: the release (default: the reproducer's)")
    from harness.flags import add_vllm_env_flags
    add_vllm_env_flags(r)
    r.add_argument("--out", default=None, metavar="DIR", help="vllm: where a CRASH's log or a HANG's report is kept")
    r.add_argument("--url", help="openai: the endpoint with overlap on")
    r.add_argument("--url-off", help="openai: the endpoint with overlap off")
    r.add_argument("--tries", type=int, default=3, metavar="N",
                   help="vllm/openai: judge the case up to N times until it fails as recorded (default 3): "
                        "async timing decides some failures; the ref engine's replay is exact and runs once")
    r.set_defaults(fn=_one_line_errors(cmd_replay))
