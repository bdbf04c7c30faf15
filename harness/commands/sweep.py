"""`overlap-harness sweep`: the vLLM gate over installed releases (harness/releases/sweep.py)."""
from __future__ import annotations

import sys
from pathlib import Path


def releases_arg(text: str | None, error) -> list[str]:
    """--releases "0.11.0,0.13.0" or "installed" (default): the releases, oldest first; every one
    named must be installed (one line naming those that are not)."""
    from harness.targets.vllm.releases import installed
    from harness.targets.vllm.releases import release_key
    have = installed()
    if text in (None, "", "installed"):
        if not have:
            raise error("no vLLM release is installed (run `overlap-harness setup vllm`)")
        return have
    want = [v.strip() for v in text.split(",") if v.strip()]
    for v in want:
        try:
            release_key(v)
        except ValueError:
            raise error(f"--releases: not a release number: {v!r}") from None
    missing = [v for v in want if v not in have]
    if missing:
        raise error(f"vLLM {', '.join(missing)} not installed (installed: {', '.join(have) or 'none'}; "
                    f"`overlap-harness setup vllm --version V` installs one)")
    return sorted(dict.fromkeys(want), key=release_key)


def cmd_sweep(a) -> int:
    from harness.flags import UsageError
    from harness.commands.check import check_writable
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
        results = sw.run_sweep(versions, gate, Path(a.out), progress=lambda s: print(s, file=sys.stderr, flush=True))
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
    s.add_argument("--check-arg", action="append", default=[], metavar="ARG",
                   help="an extra flag for each release's `check` (repeatable; e.g. --check-arg=--fault=NAME)")
    s.set_defaults(fn=cmd_sweep)
