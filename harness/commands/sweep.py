"""`overlap-harness sweep`: the vLLM gate over installed releases (harness/releases/sweep.py), each
followed by a short seeded stress (harness/releases/stress.py)."""
from __future__ import annotations

import sys
from pathlib import Path


def cmd_sweep(a) -> int:
    from harness.flags import UsageError, check_writable, releases_arg
    from harness.releases import sweep as sw
    if a.json:
        check_writable(a.json, "--json", UsageError)
    shard_of, versions = None, []
    if a.merge:
        try:
            results = sw.load(a.merge)
        except (OSError, ValueError) as e:
            raise UsageError(f"sweep --merge: {e}") from None
    else:
        shard_of = sw.parse_shard(a.shard, UsageError) if a.shard else None
        if a.stress_minutes < 0:
            raise UsageError(f"--stress-minutes must be >= 0 (0: the gate only), got {a.stress_minutes:g}")
        versions = every = releases_arg(a.releases, UsageError)
        if shard_of:
            versions = sw.shard(every, *shard_of)
            if not versions:
                print(f"sweep: shard {a.shard} has none of the {len(every)} release(s)", file=sys.stderr)
        print(f"overlap-harness sweep: vLLM {', '.join(versions)}" + (f" (shard {a.shard})" if shard_of else "")
              + f"; logs and each release's JSON in {a.out}", file=sys.stderr, flush=True)

        extra = list(a.check_arg) + (["--vllm-runner", a.vllm_runner] if a.vllm_runner != "auto" else [])

        def gate(v, out_dir):
            return sw.gate_release(v, out_dir, extra=extra, timeout=a.timeout)
        stress = None
        if a.stress_minutes > 0:
            from harness.releases.stress import stress_release
            s_extra = ["--vllm-runner", a.vllm_runner] if a.vllm_runner != "auto" else []

            def stress(v, out_dir):  # its time limit: the minutes, its pair's start and a shrink or two
                return stress_release(v, out_dir, a.stress_minutes, seed=a.stress_seed, extra=s_extra,
                                      timeout=a.stress_minutes * 60 + 900)
        results = sw.run_sweep(versions, gate, Path(a.out), progress=lambda s: print(s, file=sys.stderr, flush=True),
                               stress=stress)
    print(sw.format_table(results))
    if a.json:
        from harness.gate import json_report
        json_report.write(a.json, sw.to_json(results, None if a.merge else shard_of))
        print(f"\nJSON: {a.json}")
    from harness import stopping
    if stopping.requested():  # what was gated is printed and written above; the rest never ran
        print(f"\n{stopping.stopped_word().upper()} by {stopping.signal_name()}: {len(results)} of "
              f"{len(versions)} release(s) gated before it")
        return stopping.exit_code()
    return sw.exit_code(results)


def add_commands(sub) -> None:
    s = sub.add_parser("sweep", help="the vLLM gate over installed releases: one table release x row")
    s.add_argument("--releases", metavar="V,V,...", help="releases to gate, oldest first (default: every "
                   "installed one; `setup vllm --list` shows them)")
    s.add_argument("--shard", metavar="I/N", help="only shard I of N (1-based; every N-th release from the I-th), "
                   "for a CI matrix; `sweep --merge` joins the shards' JSON")
    s.add_argument("--out", default="out/sweep", metavar="DIR", help="each release's log and check JSON "
                   "(default: out/sweep)")
    s.add_argument("--json", metavar="FILE", help="write the table as JSON")
    s.add_argument("--merge", nargs="+", metavar="FILE", help="print (and with --json write) the table of "
                   "earlier sweeps' JSON files instead of running the gate")
    s.add_argument("--timeout", type=float, default=1800.0, metavar="S",
                   help="seconds one release's gate may take (default: 1800)")
    s.add_argument("--vllm-runner", default="auto", choices=("auto", "v1", "v2"),
                   help="the model runner each release's gate attacks (default auto: the one its build runs for "
                        "its users; a release without the runner asked is UNAVAILABLE, with why)")
    s.add_argument("--stress-minutes", type=float, default=3.0, metavar="M",
                   help="after each release's gate, a seeded stress of M minutes drawing the features and server "
                        "configurations stress draws (default 3; 0: the gate only)")
    s.add_argument("--stress-seed", type=int, default=0, metavar="S",
                   help="the stress seed, the same on every release (default 0)")
    s.add_argument("--check-arg", action="append", default=[], metavar="ARG",
                   help="an extra flag for each release's `check` (repeatable; e.g. --check-arg=--fault=NAME)")
    s.set_defaults(fn=cmd_sweep)
