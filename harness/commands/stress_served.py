"""`overlap-harness stress --target vllm|openai` and `replay FILE --target vllm|openai`: the search
against served pairs (harness.search.served.explore), its summary, its reproducers."""
from __future__ import annotations

import json
import os
import sys
import time

EXIT_FOUND, EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 130, 143
# `replay FILE --vllm-python PATH` under `git bisect run`: a commit of that checkout whose vLLM the
# agent cannot attack, or whose servers do not start, can be neither good nor bad
EXIT_CANNOT_TEST = 125


def _printer(stream=sys.stderr):
    tty = hasattr(stream, "isatty") and stream.isatty()
    last = [0.0, ""]

    def show(s, final: bool) -> None:
        now = time.monotonic()
        line = s.status_line()
        if not final and (now - last[0] < (0.2 if tty else 10.0)) and line.split(" | ")[-1] == last[1]:
            return
        last[0], last[1] = now, line.split(" | ")[-1]
        stream.write(("\r\033[K" + line + ("\n" if final else "")) if tty else line + "\n")
        stream.flush()
    return show


def check_flags(a, bad):
    """Every served-target flag checked before a server starts (`bad(msg)` -> the exception to raise);
    the VllmChoice the vLLM flags make (harness.targets.VllmChoice)."""
    if a.target == "openai":
        if not a.url or not a.url_off:
            raise bad("--target openai needs --url (overlap on) and --url-off (overlap off)")
        if a.fault:
            raise bad("--fault applies to --target ref or vllm (for openai, start the servers with it)")
    elif a.url or a.url_off:
        raise bad("--url / --url-off apply to --target openai only")
    from harness.flags import vllm_choice
    vllm = vllm_choice(a, bad)  # the one check of --vllm-version / --vllm-python / --vllm-runner
    if a.target in ("vllm", "sglang"):
        from harness.targets import check_fault_names
        check_fault_names(a.target, a.fault, bad)
    if a.target == "sglang" and a.vllm_version is not None:
        raise bad("--vllm-version applies to --target vllm only")
    if not 0 < a.minutes < float("inf"):
        raise bad(f"--minutes must be a positive number, got {a.minutes:g}")
    if not 0 <= a.shrink_minutes < float("inf"):
        raise bad(f"--shrink-minutes must be a number >= 0, got {a.shrink_minutes:g}")
    if not 1 <= a.cases_per_run <= 16:
        raise bad(f"--cases-per-run must be between 1 and 16, got {a.cases_per_run}")
    if a.max_findings < 0:
        raise bad(f"--max-findings must be >= 0, got {a.max_findings}")
    config_order(a, bad)
    if not 0 < getattr(a, "config_minutes", 2.0) < float("inf"):
        raise bad(f"--config-minutes must be a positive number, got {a.config_minutes:g}")
    return vllm


def config_order(a, bad) -> list[str]:
    """The server configurations a vLLM stress visits, one per segment (harness.targets.vllm.configs):
    --configs pins (NAME,...) or excludes (all,-NAME,...); default every runnable one, the default
    configuration first and the rest in an order drawn from --seed."""
    import random
    from harness.targets.vllm import configs as vllm_configs
    spec = getattr(a, "configs", None)
    if a.target == "sglang" and spec:  # SGLang's: default and its drafters (harness/targets/sglang/spec.py)
        from harness.targets.sglang import spec as sglang_spec
        names = sglang_spec.stress_order(spec, bad)
        if spec.strip() == "all" or spec.strip().startswith(("-", "all,")):
            rest = [n for n in names if n != "default"]
            random.Random(a.seed).shuffle(rest)
            names = [n for n in names if n == "default"] + rest
        return names
    if a.target != "vllm":
        if spec:
            raise bad(f"--configs applies to --target vllm or sglang only (not {a.target})")
        return []
    rng = random.Random(getattr(a, "seed", 0))  # replay has no --seed: it pins its configuration
    runner = getattr(a, "vllm_runner", "auto") or "auto"  # the drafters drawn are the ones it runs here
    if spec and spec.strip() == "spec":  # drafters only: a drafter and its k drawn for each of them
        return list(dict.fromkeys(vllm_configs.draw_drafted(rng, runner) for _ in range(SPEC_DRAWS)))
    names = vllm_configs.parse(spec or "all", bad)
    if not spec or spec.strip() == "all" or spec.strip().startswith(("-", "all,")):
        head = [n for n in names if n == vllm_configs.DEFAULT]
        rest = [n for n in names if n != vllm_configs.DEFAULT]
        rng.shuffle(rest)
        # a drafter's configuration in a drawn order: its drafter and num_speculative_tokens drawn too
        names = head + [vllm_configs.draw_drafted(rng, runner) if vllm_configs.get(n).spec else n for n in rest]
    return names


SPEC_DRAWS = 4  # `--configs spec`: the drafter configurations drawn (visited in turn, a segment each)


def served_pairs(a, bad, vllm=None):
    """The run's Pairs (harness.targets.Pairs): the vLLM the flags chose (`vllm`, checked once by
    harness.flags.vllm_choice; checked here when not given) and --out, for each pair the run starts."""
    from harness import targets
    from harness.flags import vllm_choice
    vllm = vllm or vllm_choice(a, bad)
    return targets.Pairs({"vllm": targets.ServedOptions(out_dir=a.out, vllm=vllm),
                          "sglang": targets.ServedOptions(out_dir=a.out)})


def make_served(a, bad, pairs):
    """(target, tokenizer, release) for --target vllm / openai; a target that cannot start is `bad`."""
    from harness.targets.base import TargetError, TargetUnavailable
    try:
        if a.target == "vllm":
            t = pairs.get("vllm", frozenset(a.fault), config=(config_order(a, bad) or [None])[0])
            t.start()
            return t, t.tokenizer(), t.version
        if a.target == "sglang":  # SGLang 0.5.23 (CPU backend here): judged black-box, as an OpenAI pair
            from harness.agents.sglang.points import WRITTEN_AGAINST
            t = pairs.get("sglang", frozenset(a.fault), config=(config_order(a, bad) or [None])[0])
            t.start()
            return t, t.tokenizer(), WRITTEN_AGAINST
        from harness.targets.openai_pair import OpenAIPair
        t = OpenAIPair(a.url, a.url_off, a.served_model)
        t.start()
        return t, _tokenizer(a.tokenizer, bad), None
    except (TargetUnavailable, TargetError, ValueError) as e:
        raise bad(str(e).strip().splitlines()[0]) from None


def _tokenizer(path, bad):
    from harness.engine.smollm2 import HFTokenizer
    from harness.targets.vllm import setup as vllm_setup
    path = path or str(vllm_setup.model_dir(vllm_setup.vllm_home(), "smollm2"))
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        raise bad(f"--tokenizer {path}: no tokenizer.json there (give the served model's tokenizer folder)")
    return HFTokenizer.from_dir(path)


def cmd_stress_served(a, bad, term) -> int:
    from harness.search.explore import parse_shard
    from harness.search.reproducer import check_writable
    from harness.search.served.explore import ServedStress, summary_lines, summary_record
    from harness.search.signals import sigterm_deferred
    vllm = check_flags(a, bad)
    try:
        shard = parse_shard(a.shard)
    except ValueError as e:
        raise bad(str(e)) from None
    try:
        check_writable(a.out)
    except OSError as e:
        raise bad(f"cannot write --out {a.out}: {e.strerror or e}") from None
    print(f"overlap-harness stress --target {a.target}: seed {a.seed}" + (f", shard {a.shard}" if shard[1] > 1 else "")
          + f", {a.minutes:g} min, {a.cases_per_run} case(s) a run, faults {', '.join(sorted(a.fault)) or 'none'}"
          + (f", vLLM {a.vllm_version}" if a.vllm_version else "")
          + (f", server configurations {', '.join(config_order(a, bad))} (a segment of {a.config_minutes:g} min each)"
             if config_order(a, bad) else "") + f", out {a.out}; starting the servers",
          file=sys.stderr, flush=True)
    s = None
    pairs = served_pairs(a, bad, vllm)
    try:
        t, tok, version = make_served(a, bad, pairs)
        agent = a.target == "vllm"
        configs = config_order(a, bad)

        def switch(name):  # one pair alive at a time: the last configuration's servers stop first
            pairs.close()
            nt = pairs.get(a.target, frozenset(a.fault), config=name)
            nt.start()
            return nt
        s = ServedStress(t, tok, seconds=a.minutes * 60, seed=a.seed, shard=shard, cases=a.cases_per_run,
                         shrink_seconds=a.shrink_minutes * 60, out=a.out, version=version, agent=agent,
                         vllm=agent, max_findings=a.max_findings, patches=a.fault, progress=_printer(),
                         configs=configs, switch=switch if agent or a.target == "sglang" else None,
                         segment_seconds=getattr(a, "config_minutes", 2.0) * 60)
        try:
            res = s.run()
        except KeyboardInterrupt:
            s.res.interrupted = True
            res = s.res
    except KeyboardInterrupt:
        print("interrupted while the servers started: nothing run", file=sys.stderr)
        pairs.close()
        return EXIT_TERMINATED if term else EXIT_INTERRUPTED
    with sigterm_deferred():
        pairs.close()  # no vLLM process outlives the run
        lines = summary_lines(s)
        print("\n".join(lines))
        with open(os.path.join(a.out, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary_record(res, lines), f, indent=1)
        lost = [x for x in lines if x.startswith("overlap: LOST on ")]  # per feature, over the run (issue 36)
        verdict = (f"FAIL: {len(res.found)} new finding(s)" if res.found else
                   f"FAIL: {lost[0]} (judged over the whole run: no single case reproduces it)" if lost else
                   "PASS: no new finding" + (f" ({len(res.known)} known upstream; {res.claims.get('tested', 0)} "
                                             f"claim(s) tested without their trigger, {res.claims.get('held', 0)} held)"
                                             if res.known else ""))
        if res.interrupted:
            verdict = ("terminated" if term else "interrupted") + f" ({verdict})"
        print(verdict)
    if res.interrupted:
        return EXIT_TERMINATED if term else EXIT_INTERRUPTED
    if res.error:
        return EXIT_BAD_INPUT if not res.runs else EXIT_FOUND
    return EXIT_FOUND if res.found or lost else 0


def cmd_replay_served(a, bad) -> int:
    from harness.search.served import repro as served_repro
    from harness.search.served.judge import judge
    from harness.verdict import code_of
    try:
        d, case = served_repro.load(a.file)
    except served_repro.BadServedRepro as e:
        raise bad(f"bad reproducer: {e}") from None
    h = d["harness"]
    if h.get("target") != a.target:
        raise bad(f"bad reproducer: {a.file} was found on --target {h.get('target')}, not {a.target}")
    a.fault = list(h.get("patches") or [])
    # the server configuration it was found in (a reproducer without one ran the default)
    from harness.targets.vllm import configs as vllm_configs
    cfg = h.get("config") or vllm_configs.DEFAULT
    if a.target == "vllm" and not vllm_configs.known(cfg):
        raise bad(f"bad reproducer: {a.file} names server configuration {cfg!r}; known: {', '.join(vllm_configs.CONFIGS)}")
    a.configs = cfg if a.target == "vllm" else h.get("config") if a.target == "sglang" else None
    if a.target == "sglang" and a.configs:  # the drafter it was found with (shrinking kept it)
        from harness.targets.sglang import spec as sglang_spec
        sglang_spec.stress_order(a.configs, lambda m: bad(f"bad reproducer: {a.file}: {m}"))
    bisecting = bool(getattr(a, "vllm_python", None))  # the vLLM is the checkout's, at whatever commit
    if not bisecting:
        a.vllm_version = a.vllm_version or h.get("vllm_version")
    a.out = a.out or "stress-out"
    a.url, a.url_off = getattr(a, "url", None), getattr(a, "url_off", None)
    a.served_model, a.tokenizer = getattr(a, "served_model", None), getattr(a, "tokenizer", None)
    rec = h.get("verdict") or {}
    print(f"replaying {a.file}: {len(case.requests)} request(s), patches {', '.join(a.fault) or 'none'}, "
          + (f"server configuration {a.configs}, " if a.configs else "")
          + f"delays {', '.join(case.delays) or 'none'}, controls {', '.join(c for _, c in case.controls) or 'none'}",
          file=sys.stderr)
    tries = getattr(a, "tries", 1)
    if tries is None or tries < 1:
        raise bad("--tries must be at least 1")
    sig = list(rec.get("signature", []))
    pairs = None
    try:
        try:
            pairs = served_pairs(a, bad)
            t, _, version = make_served(a, bad, pairs)
        except Exception as e:
            if bisecting and isinstance(e, type(bad(""))):
                print(f"cannot test this vLLM: {e}")
                return EXIT_CANNOT_TEST
            raise
        for k in range(1, tries + 1):  # until it fails as recorded: async timing decides some failures
            v = judge(t, case, version, a.target == "vllm")
            if v.refused or any(list(f.signature) == sig for f in v.new):
                break
            if k < tries:
                print(f"try {k} of {tries}: " + (f"failed differently ({v.new[0].kind})" if v.failed else
                                                 "did not fail as recorded") + "; again", file=sys.stderr)
    finally:
        if pairs is not None:
            pairs.close()
    for kid, what in v.known:
        print(f"KNOWN UPSTREAM {kid}: {what[:200]}")
    from harness.search.served import claims as served_claims
    if served_claims.line(v.claims):
        print(served_claims.line(v.claims))
    if v.refused:
        print(f"not judged: {v.refused}")
        return EXIT_CANNOT_TEST if bisecting else EXIT_BAD_INPUT
    if not v.failed:
        claimed = [kid for kid, what in v.known if code_of(what) != "known.counter"]  # not a counter's note
        if claimed:  # it fails as recorded, and a known-upstream entry (live in this release) claims it
            print(f"reproduces KNOWN UPSTREAM {claimed[0]} (not a new failure; recorded: {rec.get('kind', '?')})")
        else:
            print(f"no longer fails in {k} tr{'y' if k == 1 else 'ies'} (recorded: {rec.get('kind', '?')}: "
                  f"{rec.get('summary', '?')})")
        return 0
    same = any(list(f.signature) == sig for f in v.new)
    f = next((f for f in v.new if list(f.signature) == sig), v.new[0])
    print(f"still fails{' (the same verdict)' if same else ' (differently from the recorded verdict)'}"
          f"{f' on try {k} of {tries}' if tries > 1 else ''}: {f.kind}: {f.summary}")
    for g in v.new[1:6]:
        print(f"  also {g.kind}: {g.summary[:200]}")
    return EXIT_FOUND


def add_flags(s) -> None:
    s.add_argument("--target", default="ref", choices=("ref", "vllm", "sglang", "openai"),
                   help="ref: the embedded engine (default); vllm: two vLLM servers, async scheduling on/off, "
                        "our agent inside; openai: any two OpenAI-compatible endpoints (--url, --url-off)")
    s.add_argument("--vllm-version", metavar="V", help="vllm: the release to attack (`setup vllm --version V`)")
    from harness.flags import add_vllm_env_flags
    add_vllm_env_flags(s)
    s.add_argument("--url", help="openai: the endpoint with overlap on")
    s.add_argument("--url-off", help="openai: the endpoint with overlap off")
    s.add_argument("--served-model", help="openai: the model name (default: the first of GET /v1/models)")
    s.add_argument("--tokenizer", metavar="DIR", help="openai: the served model's tokenizer folder "
                   "(default: the vLLM setup's SmolLM2)")
    s.add_argument("--shrink-minutes", type=float, default=3.0,
                   help="vllm/openai: time limit for shrinking each new finding (default 3)")
    s.add_argument("--cases-per-run", type=int, default=4,
                   help="vllm/openai: independent request mixes merged into one submission (default 4)")
    s.add_argument("--configs", metavar="NAME,...|all|all,-NAME,...|spec",
                   help="vllm: the server configurations to draw, one per segment of runs (harness/targets/"
                        "vllm/configs.py, docs/vllm-configs.md): NAME,... pins them, all,-NAME,... excludes them "
                        "(default all, the default configuration first); spec: drafters only, each segment's "
                        "drafter and num_speculative_tokens drawn (spec-<drafter>-k<k>); sglang: default and its "
                        "drafters (harness/targets/sglang/spec.py: ngram, ngram-chain, ngram-wide; default: none)")
    s.add_argument("--config-minutes", type=float, default=2.0,
                   help="vllm: minutes of runs per configuration before the next is drawn (default 2; a "
                        "pair takes about a minute to start)")
    s.add_argument("--max-findings", type=int, default=0,
                   help="vllm/openai: stop after this many new findings (default 0: search until --minutes)")
