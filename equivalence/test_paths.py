"""vLLM's async scheduling attacked where its bugs have lived, one case per path
(harness.targets.vllm.paths.PATHS): preemption with a step in flight, chunked prefill, prefix-cache
hits, n > 1, seeded sampling across batch reorders, penalties, bad words, min_tokens, logit_bias,
stops, max_tokens 1 and 2, logprobs, custom logits processors (CLI and entry point), structured
output, pause / resume, prefix-cache reset, aborts; and the steps each request took (test_steps,
harness.oracles.steps): async may save steps, never add them or leave a request waiting.

One workload serves every row, run once on each server (async on, async off); the rows a CLI
logits processor would hide (pair "bare": vLLM repairs the output-id placeholders of every batch
once one is given, vllm#52461) run again on a second pair without one. A case
- FAILS as "not exercised" when the agent's counters say its path ran 0 times;
- fails on a clear-winner divergence, on vs off, of any request the row tags;
- and checks what the row promises besides (max_tokens: the same sampling steps as the async-off
  arm; the value-reading processor: no placeholder read; abort: the aborted stream is a prefix of
  its unaborted twin's, async off).
After the workload, once each engine is idle, its own books (harness.oracles.books) must be back:
every block, request, placeholder, batch row and generator, in both arms, a request aborted or
preempted with a step in flight included (test_books_at_idle).
A finding listed in KNOWN_UPSTREAM is reported as KNOWN UPSTREAM (an xfail with its id), never
as a pass; one that no longer reproduces is said so.
"""
import json
import time

import pytest

from harness.agents import plan as planmod
from harness.oracles import books as bookmod
from harness.oracles import effects
from harness.oracles import spec_steps
from harness.oracles import surface
from harness.oracles import steps
from harness.targets.vllm import acting
from harness.targets.vllm import paths as vp
from harness.targets.sglang import upstream as sglang_upstream
from harness.targets.vllm import workload as vllm_workload
from harness.targets.base import TargetCrash
from harness.targets.served.pair import ServedTarget
from harness.verdict import outcome
from equivalence.path_judge import judge, judge_steps


@pytest.fixture(scope="module")
def path_run(target, tok, oh_options, reset_run):  # the reset row's run first (reset_run says why)
    if target.name != "vllm" or not getattr(target, "paths", False):
        pytest.skip(f"the path table is vLLM's (its agent counts the paths); target {target.name}")
    reqs, fitted = vllm_workload.build(tok, seed=0), None
    try:  # each parameter row's inputs fitted to the model served (a probe on both servers first)
        fitted = acting.fit(target, tok, reqs, vllm_workload.repeating_prompts(tok))
        runs, cnt, ctl, books, stepbooks, spec = _both_arms(target, reqs)
    except TargetCrash:
        # a live known bug killed the async-on engine and its trigger is now left out of every
        # request (ServedTarget.proven_crashes): the pair starts again and the workload runs once
        # more, so its rows are judged (issue 36, item 6); any other death stands
        if not target.crashes or target.crashes[-1].get("known") not in ServedTarget.proven_crashes:
            raise
        target.restart_after_death()
        if fitted is None:  # the death came in the probe: fitted on the pair started again
            fitted = acting.fit(target, tok, reqs, vllm_workload.repeating_prompts(tok))
        runs, cnt, ctl, books, stepbooks, spec = _both_arms(target, reqs)
    # every parameter had an effect (issue 36, item 3): each request that sets one, again without
    # it, async off; after the counts were read, so the path counters are the workload's alone
    eff = effects.effects(runs[False], target.run(effects.copies(reqs), overlap=False))
    print(surface.summary(reqs, runs[False], runs[True]))
    _MAIN_RUN[id(target)] = pr = vp.PathRun(reqs, runs[False], runs[True], cnt[False], cnt[True], ctl, books=books,
                      installed=target.installed_logits_processors(), release=target.version,
                      runner=target.runner, steps=stepbooks, effects=eff,
                      surface=surface.findings(reqs, runs[False], runs[True], surface.detokenizer(tok),
                                               {rid: v[1] for rid, v in target.left_out.items()}),
                      absent={row.name: target.row_absent(row.name) for row in vp.PATHS if row.pair == "main"},
                      left_out=dict(target.left_out), spec=spec,
                      in_flight=steps.in_flight_of(runs[True].summary.get("facts") or []), fitted=fitted)
    return pr


# the main pair's run of this process, by target: a bare row's claims are tested on its twin row
# there (harness.gate.claims) when this process ran it; never run for that alone (a minute and more)
_MAIN_RUN: dict = {}


def _both_arms(target, reqs):
    """The workload on the async-on arm, then on the async-off one, with each arm's counts (on
    first: where a known bug kills the async-on engine, 0.11.0's, no off run is spent before it)."""
    runs, cnt, ctl, books, stepbooks, spec = {}, {}, {}, {}, {}, {}
    for overlap in (True, False):
        target.url(overlap)  # a server on other source patches restarts now: its facts are the ones counted
        facts = planmod.read_facts(str(target.facts_dir(overlap)))
        before, books_before, spec_before = vp.counts(facts), steps.books_of(facts), spec_steps.accepted_of(facts)
        verified_before = spec_steps.verified_of(facts)
        runs[overlap], ctl[overlap] = vllm_workload.run_with_controls(target, reqs, overlap)
        books[overlap] = target.idle_books(overlap)  # waits for idle: the agent's last counts are written too
        time.sleep(0.1)  # the agent flushes its counters every 0.1 s
        facts = planmod.read_facts(str(target.facts_dir(overlap)))
        cnt[overlap] = vp.delta(before, vp.counts(facts))
        stepbooks[overlap] = steps.new_since(books_before, steps.books_of(facts))
        spec[overlap] = spec_steps.new_since(spec_before, spec_steps.accepted_of(facts))
        # the worker's drafts and sampled ids per window (under "verified": the oracle's per-arm check)
        spec.setdefault("verified", {})[overlap] = spec_steps.new_since(verified_before, spec_steps.verified_of(facts))
    return runs, cnt, ctl, books, stepbooks, spec


@pytest.fixture(scope="module")
def bare_run(target, tok, oh_options):
    """The bare pair (no CLI logits processor: vLLM's placeholder repair off), its rows only; a
    pair of its own because the flag is fixed at start, kept like the main pair for the process's
    life. It runs stock vLLM: the agent's faults reach it (its plan), the source patches of the
    kill matrix do not (they re-create bugs on the main pair's rows; a restart for each would
    cost most of a minute)."""
    if target.name != "vllm" or not getattr(target, "paths", False):
        pytest.skip(f"the path table is vLLM's (its agent counts the paths); target {target.name}")
    from harness.agents.vllm.patches import PATCHES
    from harness.targets.base import TargetError, TargetUnavailable
    try:
        t = oh_options.make("vllm", frozenset(f for f in target.faults if f not in PATCHES), pair="bare")
        t.start()
    except (TargetUnavailable, TargetError) as e:
        pytest.fail(f"the bare vLLM pair (no --logits-processors) did not start: {e}", pytrace=False)
    reqs = [r for r in vllm_workload.build(tok, seed=0) if getattr(r, "phase", "main") in vllm_workload.BARE_PHASES]
    fitted = acting.fit(t, tok, reqs, vllm_workload.repeating_prompts(tok))  # as its twins are
    runs, cnt = {}, {}
    for overlap in (False, True):
        before = vp.counts(planmod.read_facts(str(t.facts_dir(overlap))))
        runs[overlap] = vllm_workload.run_bare(t, reqs, overlap)
        time.sleep(0.4)  # the agent flushes its counters every 0.1 s
        cnt[overlap] = vp.delta(before, vp.counts(planmod.read_facts(str(t.facts_dir(overlap)))))
    return vp.PathRun(reqs, runs[False], runs[True], cnt[False], cnt[True], installed=t.installed_logits_processors(),
                      release=t.version, runner=t.runner, left_out=dict(t.left_out), fitted=fitted)


@pytest.fixture(scope="module")
def reset_run(target, tok):
    """The spec_reset_in_flight row's run (harness.targets.vllm.workload.run_resets), before the
    workload (path_run asks for it first: its evidence does not wait on the workload's timing, and a
    death the workload meets later does not take this row's judgement with it): on each arm, short
    requests under resets; its own counts, step books and books at idle. Timing decides whether a
    reset meets a frame of rejected drafts in flight with its request resumed whole: where none did
    async on, once more under new prompts and reset times between the first's. A death of the
    engine here is kept as this row's CRASH (the pair starts again at the workload's first run).
    None where the row is absent (no drafter)."""
    if target.name != "vllm" or not getattr(target, "paths", False) or target.row_absent(vllm_workload.RESET_ROW):
        return None
    reqs, runs, cnt, ctl, books, stepbooks, crash = [], {}, {}, {}, {}, {}, ""
    for label, at in ((0, vllm_workload.RESETS_AT), (50, tuple(t + 0.25 for t in vllm_workload.RESETS_AT))):
        mine = vllm_workload.build_resets(tok, label)
        for overlap in (True, False):
            facts = planmod.read_facts(str(target.facts_dir(overlap)))
            before, books_before = vp.counts(facts), steps.books_of(facts)
            try:
                run, got = vllm_workload.run_resets(target, mine, overlap, at)
            except TargetCrash as e:
                crash = str(e)
                break
            books[overlap] = target.idle_books(overlap)  # waits for idle: the agent's last counts are written too
            time.sleep(0.1)  # the agent flushes its counters every 0.1 s
            facts = planmod.read_facts(str(target.facts_dir(overlap)))
            c = vp.delta(before, vp.counts(facts))
            cnt[overlap] = {k: cnt.get(overlap, {}).get(k, 0) + c.get(k, 0) for k in set(c) | set(cnt.get(overlap, {}))}
            stepbooks.setdefault(overlap, {}).update(steps.new_since(books_before, steps.books_of(facts)))
            ctl.setdefault(overlap, []).extend(got)
            if overlap in runs:
                runs[overlap].outputs += run.outputs
                runs[overlap].logprobs.update(run.logprobs)
            else:
                runs[overlap] = run
        reqs += mine
        if crash or cnt[True].get("spec_stale_drop_resumed", 0):
            break
    if crash:
        return vp.PathRun(reqs, None, None, {}, {}, {"crash": crash})
    line = (f"{vllm_workload.RESET_ROW}: {len(reqs)} requests, resets answered on/off "
          f"{sum(g[1] == 200 for g in ctl[True])}/{sum(g[1] == 200 for g in ctl[False])}; async on: stale windows "
          f"{cnt[True].get('spec_stale_windows', 0)}, a reset's with a draft rejected "
          f"{cnt[True].get('spec_stale_drop_rejections', 0)}, met by their request resumed whole "
          f"{cnt[True].get('spec_stale_drop_resumed', 0)}; placeholders below 0 on/off "
          f"{cnt[True].get('placeholders_below_zero', 0)}/{cnt[False].get('placeholders_below_zero', 0)}")
    print(line)
    for overlap in (True, False):  # the first request the agent saw below 0, said in full (the facts go with the pair)
        for f in planmod.read_facts(str(target.facts_dir(overlap))):
            if f.get("first_placeholders_below_zero") and cnt[overlap].get("placeholders_below_zero", 0):
                print(f"{vllm_workload.RESET_ROW}: async {'on' if overlap else 'off'}: first below 0: "
                      f"{json.dumps(f['first_placeholders_below_zero'], sort_keys=True)}")
    return vp.PathRun(reqs, runs[False], runs[True], cnt[False], cnt[True], {"resets": ctl, "line": line}, books=books,
                      release=target.version, runner=target.runner, steps=stepbooks,
                      absent={vllm_workload.RESET_ROW: target.row_absent(vllm_workload.RESET_ROW)},
                      in_flight=steps.in_flight_of(runs[True].summary.get("facts") or []))


def test_steps(path_run, record_property):
    judge_steps(path_run, record_property)


@pytest.mark.parametrize("row", vp.PATHS, ids=lambda r: r.name)
def test_path(target, row, record_property, request):
    if target.name != "vllm" or not getattr(target, "paths", False):  # before its CPU reasons: vLLM's
        pytest.skip(f"the path table is vLLM's (its agent counts the paths); target {target.name}")
    if row.cpu_reason:
        outcome.na(f"{row.name}: not on vLLM's CPU build: {row.cpu_reason}", "cpu_build")
    version = target.version
    absent = target.row_absent(row.name) if hasattr(target, "row_absent") else ""
    if absent:  # the release (runner, configuration) has no such path: n/a, reported apart by the gate
        outcome.na(absent)
    pr = request.getfixturevalue("bare_run" if row.pair == "bare" else "reset_run" if row.name == vllm_workload.RESET_ROW
                                 else "path_run")
    if pr.controls.get("crash"):  # the engine died under the row's own run: the row's CRASH
        raise TargetCrash(pr.controls["crash"])
    if pr.controls.get("line"):  # the reset row's shape, counted: in the gate's report
        record_property("spec", pr.controls["line"])
    if row.name.startswith("installed_logits_processors"):  # the report lists what a team ships
        for ep in pr.installed:
            record_property("installed", ep)
    if row.violations and row.pair == "main" and row.violations[0].startswith("spec_lp"):  # what the agent saw at
        # its first violations, said in full (the rejection sampler's reads; the reset row prints its own)
        _violation_rows(target, row, pr, record_property)
    judge(row, pr, record_property, version=version, twin=_MAIN_RUN.get(id(target)) if row.pair == "bare" else None)


def _violation_rows(target, row, pr, record_property) -> None:
    """The rows the agent kept at a violation (spec_lp_rows: the request, where its -1s sat, its
    previous step), printed and in the JUnit/JSON properties: the pair's work folder, with the
    facts, goes when the gate ends, and a violation must be explainable after it."""
    counter = row.violations[0]
    for overlap, c in ((True, pr.counts_on), (False, pr.counts_off)):
        arm = f"async {'on' if overlap else 'off'}"
        lines = []
        if c.get("spec_lp_padded_drafts", 0):  # vLLM's padding, no read (harness.agents.vllm.spec.padded_drafts)
            lines.append(f"{row.name}: {arm}: {c['spec_lp_padded_drafts']} padded draft(s) (-1 verified as -1: "
                         "rejected by vLLM, no read)")
        for f in planmod.read_facts(str(target.facts_dir(overlap))):
            for key, what in (("spec_lp_rows", "read") if c.get(counter, 0) else ("", ""),
                              ("spec_lp_padded_rows", "padded") if c.get("spec_lp_padded_drafts", 0) else ("", "")):
                lines += [f"{row.name}: {arm}: {what}: {json.dumps(r, sort_keys=True)}" for r in f.get(key) or ()]
        for line in lines:
            record_property("spec", line)  # the gate prints and keeps them (GateResult.spec)
            print(line)


def test_books_at_idle(path_run, record_property):
    """Nothing leaks: after the workload (aborts and preemptions with a step in flight among it),
    each idle engine has every block, request, placeholder, batch row and generator back, and
    the async arm holds nothing the off arm released (harness.oracles.books)."""
    on, off = path_run.books.get(True) or {}, path_run.books.get(False) or {}
    for arm, bk in (("on", on), ("off", off)):
        record_property("books", bookmod.line(bk, arm))
    for what in ("aborted_in_flight", "preempted_in_flight"):
        # a server configuration without preemption (a batch of one, a pool never short) says so
        if what == "preempted_in_flight" and path_run.absent.get("preemption_in_flight"):
            record_property("books", path_run.absent["preemption_in_flight"])
            continue
        if path_run.counts_on.get(what, 0) <= 0:
            outcome.not_exercised(f"not exercised: no request {what.split('_')[0]} with a step in flight (async on)",
                                  "books.not_in_flight")
    bad = bookmod.findings(on, off)
    if bad:
        outcome.fail(f"books: {bad[0]}" + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""), "books.leak")


# -- SGLang's overlap paths (harness.targets.sglang.paths): the same judgement, SGLang's counters --
@pytest.fixture(scope="module")
def sglang_path_run(target, tok):
    """The SGLang path workload once on each arm of the gate's pair (the default model's pair runs
    the path setting), with the counts, SGLang's own books at idle and the step books."""
    from harness.targets.sglang import paths as sp
    if target.name != "sglang" or not getattr(target, "paths", False):
        pytest.skip(f"the SGLang path table needs the SGLang pair of the default model; target {target.name}")
    reqs = sp.build(tok, seed=0)
    if getattr(target, "spec", None) is not None:  # a drafter: the speculative rows' requests too
        from harness.targets.sglang import spec as sglang_spec
        reqs = sglang_spec.tag(reqs, tok)
    from harness.targets.sglang.spec import windows_of
    runs, cnt, books, stepbooks, wins, wall = {}, {}, {}, {}, {}, {}
    for overlap in (False, True):
        target.url(overlap)  # a server on other source patches restarts now: its facts are the ones counted
        facts = planmod.read_facts(str(target.facts_dir(overlap)))
        before, books_before, wins_before = sp.counts(facts), steps.books_of(facts), windows_of(facts)
        t0 = time.monotonic()
        runs[overlap] = target.run(reqs, overlap=overlap)
        wall[overlap] = time.monotonic() - t0
        books[overlap] = target.idle_books(overlap)  # waits for SGLang's own idle check
        time.sleep(0.3)  # the agent flushes its counters every 0.1 s
        facts = planmod.read_facts(str(target.facts_dir(overlap)))
        cnt[overlap] = sp.delta(before, sp.counts(facts))
        stepbooks[overlap] = steps.new_since(books_before, steps.books_of(facts))
        wins[overlap] = spec_steps.new_since(wins_before, windows_of(facts))  # a drafter's windows (rids are new)
    on = runs[True].summary  # the per-request evidence of the known entries (overlap on)
    stale = sglang_upstream.stale_by_request(on.get("facts") or [], on.get("facts_before") or [])
    return vp.PathRun(reqs, runs[False], runs[True], cnt[False], cnt[True], books=books,
                      release=target.version, steps=stepbooks, controls={"stale": stale, "wall": wall}, spec=wins)


def _sglang_rows():
    from harness.targets.sglang.paths import PATHS
    from harness.targets.sglang.spec import SPEC_ROWS
    return PATHS + SPEC_ROWS


@pytest.mark.parametrize("row", _sglang_rows(), ids=lambda r: f"sglang-{r.name}")
def test_sglang_path(target, row, record_property, request):
    if target.name != "sglang":
        pytest.skip(f"SGLang's path table; target {target.name}")
    if row.cpu_reason and getattr(target, "device", "") == "cpu":
        outcome.not_exercised(f"not exercised: {row.name} on SGLang's CPU backend: {row.cpu_reason}", "cpu_backend",
                              skip=True)
    spec = getattr(target, "spec", None)  # the drafter's configuration (harness.targets.sglang.spec)
    from harness.targets.sglang.spec import SPEC_ROW_NAMES, row_absent
    cfg = spec or getattr(target, "multi", None)  # a drafter's or several ranks' configuration
    if row_absent(row.name, cfg):  # a drafter's row, no drafter: no such path (with one, a 0 count fails in judge)
        outcome.na(row_absent(row.name, cfg))
    why = dict(cfg.absent).get(row.name) if cfg is not None else None
    if why:
        outcome.not_exercised(f"not exercised: {row.name} with {cfg.name}: {why}",
                              "drafter_absent" if spec is not None else "config_absent", skip=True)
    pr = request.getfixturevalue("sglang_path_run")
    if row.name in SPEC_ROW_NAMES and row.violations:  # the agent's first violation, said in full (the
        # counters name it only; the pair's work folder, with the facts, goes when the gate ends)
        for overlap in (True, False):
            for f in planmod.read_facts(str(target.facts_dir(overlap))):
                first = next((v for k, v in f.items() if k.startswith("first_spec_") and v), None)
                if first:
                    record_property("spec", f"async {'on' if overlap else 'off'}: first: {first}")
                    print(f"{row.name}: async {'on' if overlap else 'off'}: first: {first}")
                for v in f.get("spec_violations") or ():  # the next few, for the diagnosis (JUnit keeps them)
                    record_property("spec", f"async {'on' if overlap else 'off'}: {v}")
    if row.name == "spec_verify":  # the drafter's acceptance and speed on each arm, in the gate's report
        from harness.targets.sglang.spec import acceptance_line, speed_line
        for arm, c, ov in (("on", pr.counts_on, True), ("off", pr.counts_off, False)):
            for line in (acceptance_line(c, arm), speed_line(c, pr.controls.get("wall", {}).get(ov, 0.0), arm)):
                record_property("spec", line)
                print(line)
    if row.name == "spec_overlap":  # overlap judged on the verify steps alone
        from harness.targets.sglang.spec import overlap_line
        lost, line = overlap_line(pr.counts_on)
        record_property("spec", line)
        print(line)
        if lost:
            outcome.fail(f"spec_overlap: overlap lost on the speculative steps: {line}", "overlap.lost")
    if row.name == "spec_acceptance":
        _judge_acceptance(row, pr, record_property)
    judge(row, pr, record_property, known=sglang_upstream.KNOWN,
          evidence=sglang_upstream.evidence_for(pr.reqs, pr.controls.get("stale", {})))


def _judge_acceptance(row, pr, record_property) -> None:
    """A drafter's windows on vs off (harness.targets.sglang.spec.acceptance_verdict)."""
    from harness.targets.sglang.spec import acceptance_verdict
    line, found, alike = acceptance_verdict(pr.reqs, pr.off, pr.on, pr.spec.get(True, {}), pr.spec.get(False, {}))
    record_property("spec", line)
    print(line)
    if found:
        outcome.fail(f"spec_acceptance: {found[0]}" + (f" (+{len(found) - 1} more)" if len(found) > 1 else ""),
                     "spec.acceptance")
    if not alike:
        outcome.not_exercised(f"not exercised: {line}", "path.not_run")


def test_sglang_steps(target, sglang_path_run, record_property):
    if getattr(target, "spec", None) is not None:
        from harness.targets.sglang.spec import STEPS_WITH_DRAFTER
        pytest.skip(f"not exercised: steps with {target.spec.name}: {STEPS_WITH_DRAFTER}")
    judge_steps(sglang_path_run, record_property, known=[])


def test_sglang_books_at_idle(sglang_path_run, record_property):
    """SGLang's own idle check on both arms after the path workload (retractions and aborts with a
    step in flight among it): every req_to_token row back, no pool leak reported."""
    lines, bad = [], []
    for overlap, arm in ((True, "on"), (False, "off")):
        bk = sglang_path_run.books.get(overlap) or {}
        e = bk.get("engine")
        if e is None:
            lines.append(f"overlap {arm}: not read: {bk.get('engine_error')}")
            bad.append(f"overlap {arm}: SGLang's books were not read ({bk.get('engine_error')})")
            continue
        # each rank's scheduler apart (TP/PP: its own pool and rows), named (issue 45)
        for lab, p in (bk.get("ranks") or {"": {**e, "first_leak": bk.get("first_leak", "")}}).items():
            who = f"{lab}: " if lab else ""
            lines.append(f"overlap {arm}: {who}{p['req_rows_total'] - p['req_rows_held']} of {p['req_rows_total']} "
                         f"rows free, {p['pool_leaks']} leak(s)")
            if p["req_rows_held"] or p["pool_leaks"]:
                bad.append(f"overlap {arm}: {who}{p['req_rows_held']} req_to_token row(s) held at idle, "
                           f"{p['pool_leaks']} pool leak(s): {p.get('first_leak', '')}")
    record_property("books", "; ".join(lines))
    on, off = sglang_path_run.counts_on, sglang_path_run.counts_off
    if on.get("spec_verify_steps", 0) or off.get("spec_verify_steps", 0):  # a drafter: every decode step verifies
        record_property("books", f"with drafts in flight (overlap on): {on.get('path_abort_in_flight', 0)} abort(s), "
                        f"{on.get('path_retraction', 0)} retraction(s), {on.get('path_finish_in_flight', 0)} finish(es) "
                        f"with a verify step in flight; {on.get('path_spec_window_released', 0)} window(s) of requests "
                        "released before their launch")
        if not (on.get("spec_verify_steps", 0) and off.get("spec_verify_steps", 0)):
            outcome.not_exercised("not exercised: books with drafts in flight: a verify step on one arm only",
                                  "books.not_in_flight")
    for what in ("path_abort_in_flight", "path_retraction"):
        if sglang_path_run.counts_on.get(what, 0) <= 0:
            outcome.not_exercised(f"not exercised: {what} (overlap on) before the books were read",
                                  "books.not_in_flight")
    if bad:
        outcome.fail(f"books: {bad[0]}" + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""), "books.leak")
