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
from harness.oracles import path_overlap
from harness.oracles import spec_steps
from harness.oracles import surface
from harness.oracles import steps
from harness.oracles.divergence import record_problems, run_logprobs
from harness.oracles.reference import divergences
from harness.targets.vllm import acting
from harness.targets.vllm import paths as vp
from harness.targets.sglang import upstream as sglang_upstream
from harness.targets.vllm import upstream as vllm_upstream
from harness.targets.vllm import workload as vllm_workload
from harness.targets.base import TargetCrash
from harness.targets.served.pair import ServedTarget
from harness.gate import claims as gate_claims
from harness.verdict import outcome
from harness.verdict import Finding, code_of


@pytest.fixture(scope="module")
def path_run(target, tok, oh_options):
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
                      surface=surface.findings(reqs, runs[False], runs[True], surface.detokenizer(tok)),
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


def row_findings(row: vp.PathRow, pr: vp.PathRun, record_property=None) -> list[str]:
    """What is wrong on this row's requests, async on vs off (and the row's own promises)."""
    rids = {r.rid for r in pr.reqs if row.name in r.paths}
    out = []
    drafted_apart = spec_steps.sampled_apart(pr.reqs, pr.spec.get("verified") or {})
    for _, _, divs in divergences(pr.off, pr.on):
        for d in divs:
            if d.rid.split("#")[0] in drafted_apart:
                continue  # a sampled request the arms drafted for differently: its draws follow its windows
            if d.rid.split("#")[0] in rids and not d.near_tie:
                out.append(Finding(f"request {d.rid} diverges at token {d.position} ({d.verdict}): off "
                                   f"{d.expected[:6]} vs on {d.got[:6]}", "divergence", d.rid.split("#")[0]))
                _explain_spec_divergence(pr, d.rid, record_property)
    for lab, run in (("on", pr.on), ("off", pr.off)):  # a record that is not its token's: a race
        mine = [o for o in run.outputs if o[0].split("#")[0] in rids]
        out += [Finding(f"async {lab}: {p}", f"record.{lab}") for p in record_problems(mine, run_logprobs(run))]
    for rid in sorted(rids):  # the other fields of its responses (issue 36, item 2)
        out += [Finding(f"request {rid}: {w}", code_of(w), rid) for w in pr.surface.get(rid, ())]
    if row.name == "max_tokens_1_2":
        for k in (1, 2):
            on, off = pr.counts_on.get(f"sampled_max{k}", 0), pr.counts_off.get(f"sampled_max{k}", 0)
            want = k * pr.counts_off.get(f"max{k}_requests", 0)
            # a preemption with the request's step in flight throws that sample away and draws the
            # position again (vLLM's design; the steps oracle leaves such requests out): async on may
            # spend one sampling step more for each drop the agent counted for a max-k request (a
            # small --max-num-seqs makes the workload's prefix-cache reset hit them: configuration one-seq)
            dropped = _stale_drops(pr, k)
            if off != want or not want <= on <= want + dropped:
                out.append(Finding(f"max_tokens {k}: {on} sampling steps async on, {off} off, {want} expected"
                                   + (f" (+{dropped} allowed: in-flight samples dropped by a preemption)" if dropped
                                      else ""), "steps.sampling"))
    if row.placeholders:  # a value-reading processor of ours counts what it read: said first
        for lab, c in (("off", pr.counts_off), ("on", pr.counts_on)):
            if c.get(row.placeholders, 0):
                out.insert(0, Finding(f"async {lab}: the processor read {c[row.placeholders]} placeholder(s) "
                                      f"where an output token id belongs ({row.placeholders})", f"placeholders.{lab}"))
    if row.violations:  # an invariant the agent checks where the path runs (SGLang's entry 0)
        counter, what = row.violations
        for lab, c in (("off", pr.counts_off), ("on", pr.counts_on)):
            if c.get(counter, 0):  # its code: the counter (what a known entry claims it by)
                out.insert(0, Finding(f"async {lab}: {c[counter]} {what} ({counter})", counter))
    apart = sorted(drafted_apart & rids)
    if apart:
        print(f"{row.name}: {len(apart)} sampled request(s) drafted for differently by the two arms, their tokens "
              f"not compared ({', '.join(apart[:6])}): {spec_steps.SAMPLED_APART}")
    if row.name == "spec_windows":  # the verify rule, window by window, for the greedy requests (spec_steps)
        from harness.agents.vllm.steps import request_key
        keys = [request_key(r.prompt_ids, r.max_new_tokens) for r in pr.reqs if row.name in r.paths]
        verified = pr.spec.get("verified") or {}
        checked = 0
        for overlap, arm in ((True, "on"), (False, "off")):
            found, n = spec_steps.verify_findings(verified.get(overlap) or {}, keys, arm)
            out += found
            checked += n
        compared, apart = spec_steps.drafts_apart(verified.get(True) or {}, verified.get(False) or {}, keys)
        line = (f"async on {spec_steps.summary_line(pr.spec.get(True, {}))}; off "
                f"{spec_steps.summary_line(pr.spec.get(False, {}))}; {checked} greedy window(s) verified (both arms), "
                f"{compared} compared across the arms, {apart} drafted other ids there (the drafter's numerics in "
                "another batch, or another context: reported); stale windows async on "
                f"{pr.counts_on.get('spec_stale_windows', 0)}, a reset's with a draft rejected "
                f"{pr.counts_on.get('spec_stale_drop_rejections', 0)} (vllm#46066's class)")
        print(f"spec_windows: {line}")
        if record_property is not None:
            record_property("spec", line)
        if not checked:
            out.append("not exercised: the worker recorded no greedy request's window (spec_verify)")
    if row.name == "pause_resume":
        for ov, got in pr.controls.items():
            bad = [g for g in got if g[1] != 200]
            if bad:
                out.append(f"async {'on' if ov else 'off'}: {bad[0][0]} answered {bad[0][1]}: {bad[0][2]}")
    if row.name == "abort":
        full_off = {rid: ids for rid, ids, _ in pr.off.outputs}
        for rid, ids, _ in pr.on.outputs:
            twin = full_off.get(f"{rid}full")
            if twin is not None and list(ids) != list(twin[:len(ids)]):
                out.append(f"aborted request {rid}: its stream {list(ids)} (async on) is not a prefix of "
                           f"its unaborted twin's {list(twin[:len(ids) + 2])} (async off)")
    return out


def _explain_spec_divergence(pr: vp.PathRun, rid: str, record_property=None) -> None:
    """On a drafter's configuration, what a diverging request's windows were on each arm (the
    worker's drafts and sampled ids) and the mechanisms the agent counted for it async on: its
    divergence is then explainable from the gate's output alone (the facts go with the pair)."""
    verified = (pr.spec or {}).get("verified") or {}
    r = next((x for x in pr.reqs if x.rid == rid.split("#")[0]), None)
    if r is None or not (verified.get(True) or verified.get(False)):
        return
    from harness.agents.vllm.steps import request_key
    key = request_key(r.prompt_ids, r.max_new_tokens)
    books = (pr.steps or {}).get(True)
    ev = {m: n for m, n in steps.evidence_of(steps.summed(books), r).items() if n} if books else {}
    for arm, ov in (("on", True), ("off", False)):
        wins = {v: w for v, (k, w) in (verified.get(ov) or {}).items() if k == key}
        line = f"spec: request {rid} async {arm}: windows {json.dumps(wins)[:1500]}" + (f"; counted {ev}" if ov else "")
        print(line)
        if record_property is not None:
            record_property("spec", line)


def _evidence_sum(pr: vp.PathRun, mechanism, which) -> int:
    """The mechanisms the agent counted (async on; `mechanism`: name -> counted) over the requests
    `which` selects."""
    books = (pr.steps or {}).get(True)
    if not books:
        return 0
    summed = steps.summed(books)
    return sum(n for r in pr.reqs if which(r) for m, n in steps.evidence_of(summed, r).items() if mechanism(m))


def _stale_drops(pr: vp.PathRun, k: int) -> int:
    """In-flight samples of the run's max_tokens-k requests that a preemption dropped, async on (the
    agent's `stale_dropped:<path>` evidence, harness.agents.vllm.steps)."""
    return _evidence_sum(pr, lambda m: m.startswith("stale_dropped:"), lambda r: r.max_new_tokens == k)


def overlap_on_row(row: vp.PathRow, pr: vp.PathRun, record_property=None) -> str:
    """Overlap on this row's requests alone, async on (harness.oracles.path_overlap): the line
    when it is LOST there, else "" (its figures go to the report either way)."""
    books = (pr.steps or {}).get(True)
    if not books:
        return ""  # the bare pair keeps no step books; the main pair's twin rows judge its paths
    lost, line, mine = path_overlap.judge_row(row.name, books, [r for r in pr.reqs if row.name in r.paths], pr.reqs)
    if record_property is not None:
        record_property("path_overlap", f"{row.name}={mine.overlapped}/{mine.judged}")
    print(line)
    return line if lost else ""


def judge(row: vp.PathRow, pr: vp.PathRun, record_property=None, known=None, version=None, evidence=None,
          twin: vp.PathRun | None = None) -> None:
    """Fail, xfail (known upstream) or pass one row; the count goes to the gate's path table.
    `version`: the vLLM release in force; a known upstream entry counts only inside its range.
    `twin`: the main pair's run, where a bare row's claims are tested without their trigger
    (harness.gate.claims: a claim must explain the whole finding)."""
    c_on, c_off = vp.row_count(row, pr.counts_on), vp.row_count(row, pr.counts_off)
    if record_property is not None:
        record_property("path_count", f"{row.name}={c_on}/{c_off}")
    crash = left_out_of(row, pr)  # the row's own parameter was not sent: a known crash's trigger
    arms = [("on", c_on)] + ([("off", c_off)] if row.arm == "both" else [])
    for lab, c in arms:
        if c <= 0 and not crash:
            outcome.not_exercised(f"not exercised: {row.name} ran 0 times (async {lab}; counters "
                                  f"{', '.join(row.counters)})", "path.not_run")
    if row.name in pr.fitted and record_property is not None:  # harness.targets.vllm.acting: said in the verdict
        record_property("fitted", pr.fitted[row.name])
    if pr.effects is not None and not crash:  # the bare pair's rows: their twins on the main pair judge it
        exercised, line = effects.row_verdict(row.name, pr.reqs, pr.effects)
        if exercised is False:  # a parameter that changed nothing: its path was not attacked
            outcome.not_exercised(line, "effects.none")
        if line:
            print(line)
    both = {k: pr.counts_on.get(k, 0) + pr.counts_off.get(k, 0) for k in set(pr.counts_on) | set(pr.counts_off)}
    if row.name == "max_tokens_1_2":  # the row's requests' own mechanism: a step scheduled past their cap
        both["scheduled_at_cap"] = _evidence_sum(pr, lambda m: m == "scheduled_at_cap",
                                                   lambda r: r.max_new_tokens in (1, 2))
    found = row_findings(row, pr, record_property)
    lost = overlap_on_row(row, pr, record_property)
    if lost:
        found.insert(0, Finding(lost, "overlap.lost"))
    new, seen, gone = vllm_upstream.classify(row.name, found, known, both,
                                  version if version is not None else pr.release,
                                  evidence=evidence or _request_evidence(pr), runner=pr.runner)
    new, seen = gate_claims.on_twin(row.name, new, seen, twin, known, record_property)
    _report(row.name, new, seen + ([crash] if crash else []), gone, record_property)


def _request_evidence(pr: vp.PathRun):
    """finding -> the mechanisms the agent counted, async on, for the request the finding names
    ("request <rid> ..."): what a known entry with request_evidence claims by (issue 36, item 7)."""
    books = (pr.steps or {}).get(True)
    if not books:
        return None
    summed, by_rid = steps.summed(books), {r.rid: r for r in pr.reqs}

    def of(finding: str) -> dict:  # the request a Finding names (harness.verdict.Finding.rid)
        r = by_rid.get(finding.rid.split("#")[0]) if isinstance(finding, Finding) else None
        return steps.evidence_of(summed, r) if r is not None else {}
    return of


def left_out_of(row: vp.PathRow, pr: vp.PathRun) -> tuple[str, str] | None:
    """(known id, why) when a parameter this row attacks was left out of its requests because that
    known bug killed the async-on engine earlier in the run (ServedTarget.leave_out), else None.
    A request that only carries such a field beside its row's own (p7's frequency penalty on the
    preemption rows) is judged as sent."""
    params = set(effects.ROW_PARAMS.get(row.name, ()))
    hit = [(rid, v) for rid, v in sorted(pr.left_out.items())
           if params & set(v[1]) and any(r.rid == rid.split("#")[0] and row.name in r.paths for r in pr.reqs)]
    if not hit:
        return None
    kid, fields, case = hit[0][1]
    return kid, (f"the async-on engine died on it in {case}; {', '.join(fields)} left out of "
                 f"{len(hit)} request(s) of this row since, both arms ({', '.join(r for r, _ in hit[:4])}), "
                 f"the rest of the row judged")


def _report(row: str, new, seen, gone, record_property=None) -> None:
    for kid in gone:
        if record_property is not None:
            record_property("known_gone", kid)
        print(f"known upstream {kid} no longer reproduces on {row}")
    if new:
        outcome.fail(f"{row}: {new[0]}" + (f" (+{len(new) - 1} more)" if len(new) > 1 else ""), code_of(new[0]))
    if seen:
        outcome.known(seen[0][0], seen[0][1], len(seen) - 1)


def judge_steps(pr: vp.PathRun, record_property=None, known=None) -> str:
    """The steps oracle (harness.oracles.steps) over the workload: async may save steps, never add
    them, and never leave a request waiting with budget free where the off arm ran it. Fails as
    "not exercised" when the agent kept no books or no request capped by max_tokens compared."""
    if not pr.steps.get(False) or not pr.steps.get(True):
        outcome.not_exercised("not exercised: steps: the agent kept no books of the requests' steps "
                              f"(async off {len(pr.steps.get(False) or {})}, on {len(pr.steps.get(True) or {})} "
                              "requests)", "steps.no_books")
    v = steps.compare(pr.reqs, steps.summed(pr.steps[False]), steps.summed(pr.steps[True]),
                      spec_steps.parted_keys(pr.spec.get(True, {}), pr.spec.get(False, {})),
                      {k for ov in (True, False) for k, _ in (pr.spec.get(ov) or {}).values()},
                      in_flight=pr.in_flight)
    line = steps.summary_line(v)
    if record_property is not None:
        record_property("path_count", f"steps={v.compared}/{v.compared}")
    print(line)
    if v.length_capped == 0:
        outcome.not_exercised(f"not exercised: steps: no request capped by max_tokens was compared ({line})",
                              "steps.none_capped")
    # a known entry claims a step finding only with its mechanism counted for that request (issue 36)
    new, seen, gone = vllm_upstream.classify("steps", v.findings, known, None, pr.release, evidence=v.evidence.get,
                                             runner=pr.runner)
    new, seen = gate_claims.on_twin("steps", new, seen, None, known, record_property)  # one run: not tested here
    _report("steps", new, seen, gone, record_property)
    return line


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
    pr = request.getfixturevalue("bare_run" if row.pair == "bare" else "path_run")
    if row.name.startswith("installed_logits_processors"):  # the report lists what a team ships
        for ep in pr.installed:
            record_property("installed", ep)
    if row.violations and row.pair == "main":  # what the agent saw at its first violations, said in full
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
