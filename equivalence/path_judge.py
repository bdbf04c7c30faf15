"""How one path row of the vLLM paths suite is judged (equivalence/test_paths.py runs the workload
and calls these): a row's findings on vs off (clear-winner divergences, the records, the surface
notes, the row's own promise), the overlap share of its waits, the known-upstream claims with their
evidence and the steps every request took. Pure functions of a PathRun: tests build a PathRun by
hand and judge it without a server (tests/test_vllm_paths.py, tests/test_steps_oracle.py); kept out
of the test module so the suite stays a runner of the workload (the 500-line rule, docs/layout.md)."""
import json

from harness.gate import claims as gate_claims
from harness.oracles import effects
from harness.oracles import path_overlap
from harness.oracles import spec_steps
from harness.oracles import steps
from harness.oracles.divergence import record_problems, run_logprobs
from harness.oracles.reference import divergences
from harness.targets.vllm import paths as vp
from harness.targets.vllm import upstream as vllm_upstream
from harness.verdict import Finding, code_of, outcome


def _failed(pr: vp.PathRun, rid: str) -> str:
    """"; async on: server error ..." when an arm's answer to `rid` was the server's error (its
    tokens end there: the divergence is the error's, and the error says why), else ""."""
    said = []
    for lab, run in (("on", pr.on), ("off", pr.off)):
        for o in run.outputs:
            if o[0] == rid and str(o[2] or "").startswith("server error"):
                said.append(f"; async {lab}: {str(o[2])[:240]}")
    return "".join(said)


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
                                   f"{d.expected[:6]} vs on {d.got[:6]}" + _failed(pr, d.rid), "divergence",
                                   d.rid.split("#")[0]))
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
    if row.name == "spec_reset_in_flight" and pr.books:  # its own run's books at idle (test_paths' reset_run)
        from harness.oracles import books as bookmod
        # a host buffer alone is not judged: the worker writes its books before the output thread
        # frees the last step's buffer (as test_path_pairs and the served judge do)
        held = bookmod.HELD["host_buffers_held"]
        out += [Finding(f"books: {f}", "books.leak") for f in bookmod.findings(pr.books.get(True) or {},
                                                                              pr.books.get(False) or {}) if held not in f]
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
