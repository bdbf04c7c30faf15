"""The served search without a server: the case generator, the shrinker, the reproducer writer and
reader, the known-upstream classification of stress findings, and the CLI's one-line errors
(harness/search/served_*.py, harness/commands/stress_served.py). The searches against vLLM itself
are tests/test_vllm_stress.py."""
import random

import pytest
from hypothesis import HealthCheck, Phase, find, settings

from harness.search.served import case as sc
from harness.search.served import repro as served_repro
from harness.search.served.judge import Finding, Verdict, _classify
from harness.search.served.shrink import shrink


class Tok:
    """A stand-in tokenizer: one id per character (enough for the generator's prompts)."""
    bos_id, add_bos = 1, True

    def encode(self, text):
        return [32 + (ord(c) % 200) for c in text]


def _draw(n=12, seed=3, **kw):
    got = []
    find(sc.submissions(Tok(), **kw), lambda c: got.append(c) or len(got) >= n,
         settings=settings(database=None, max_examples=200, phases=[Phase.generate],
                           suppress_health_check=list(HealthCheck)), random=random.Random(seed))
    return got


def test_delay_points_are_the_agents():
    from harness.agents.vllm.points import DELAY_POINTS
    assert sc.DELAY_POINTS == DELAY_POINTS


def test_submissions_cover_the_paths_and_fit_the_servers():
    from harness.targets.vllm import paths as vp
    cases = _draw(60)  # 40 drew no reset once the path table grew its drafter rows (the draw shifted)
    feats = {f for c in cases for f in sc.case_features(c)}
    for want in ("seeded", "n>1", "penalties", "bad_words", "min_tokens", "logit_bias", "stop", "structured_outputs",
                 "chunked_prefill", "shared_prefix", "abort", "arrival", "max_tokens<=2", "pause", "reset"):
        assert want in feats, (want, sorted(feats))
    assert any(f.startswith("lp:") for f in feats) and any(f.startswith("delay:") for f in feats)
    for c in cases:
        assert c.cases == 4 and len({r.rid for r in c.requests}) == len(c.requests)
        for r in c.requests:
            assert len(r.prompt_ids) + r.max_new_tokens <= vp.MAX_MODEL_LEN
            assert r.abort_after is None or 1 <= r.abort_after < r.max_new_tokens
            assert r.n == 1 or (r.seed is not None and r.abort_after is None)
            # what vLLM refuses (400) is never drawn: prompt logprobs on a stream (an aborted client reads one)
            assert not (r.extra.get("prompt_logprobs") and (r.abort_after is not None or r.extra.get("stream")))
            assert r.extra.get("min_tokens", 0) <= r.max_new_tokens
            # what the engine fails in both arms is never drawn: a forced token against a grammar
            assert not (r.extra.get("structured_outputs") and sc.XARGS["boost"] in (r.extra.get("vllm_xargs") or {}))
        assert set(c.delays) <= set(sc.DELAY_POINTS)
    assert any(r.extra.get("structured_outputs") and r.extra.get("vllm_xargs") for c in cases for r in c.requests)


def test_a_pressure_mix_fills_the_pool_while_decoding():
    """Three prompts of 9 blocks fit the path pair's pool once prefilled, and together need more
    than it holds before the first of them ends: the preemption falls on a decoding request (the
    pool filled during a prefill preempts that prefill, with no token in flight)."""
    from harness.targets.vllm import paths as vp
    mixes = []
    for c in _draw(120, seed=4):
        huge = [r for r in c.requests if r.max_new_tokens >= 40]  # only a pressure mix's run past 24
        assert len(huge) % 3 == 0
        mixes += [huge[i:i + 3] for i in range(0, len(huge), 3)]
    assert len(mixes) >= 3
    blocks = lambda n: -(-n // vp.BLOCK)
    for mix in mixes:
        assert sum(blocks(len(r.prompt_ids)) for r in mix) <= vp.KV_BLOCKS
        assert len({tuple(r.prompt_ids[:vp.BLOCK]) for r in mix}) == 3  # no block shared by prefix caching
        # every one crosses into its 10th block within 32 tokens, and is still running then
        assert all(blocks(len(r.prompt_ids)) == 9 and 9 * vp.BLOCK - len(r.prompt_ids) < 32 <= r.max_new_tokens
                   and r.ignore_eos for r in mix)
        # nothing ends one early (a stop, a grammar, min_tokens' stop id, a disconnect), all sent at once
        assert all(r.abort_after is None and not r.stop and r.n == 1 and r.arrival == mix[0].arrival
                   and not {"stop_token_ids", "structured_outputs", "min_tokens"} & set(r.extra) for r in mix)
        assert sum(blocks(len(r.prompt_ids) + r.max_new_tokens) for r in mix) > vp.KV_BLOCKS


def test_an_openai_pair_gets_no_vllm_fields_nor_agent_delays():
    for c in _draw(20, agent=False, vllm=False):
        assert not c.delays and not c.controls
        for r in c.requests:
            assert not set(r.extra) & set(sc.VLLM_ONLY) and r.repetition_penalty == 1.0 and not r.ignore_eos


def test_the_shrinker_keeps_only_what_the_failure_needs():
    """A fake failure: a request with bad_words beside a reset. The shrinker drops the rest and every
    parameter the failure does not need."""
    case = next(c for c in _draw(60, seed=5) if any("bad_words" in r.extra for r in c.requests)
                and len(c.requests) > 3)
    case.controls = [(0.5, "reset")]

    def fails(c):
        return any("bad_words" in r.extra for r in c.requests) and any(w == "reset" for _, w in c.controls)
    tries = []
    best, n = shrink(case, lambda c: tries.append(1) or fails(c), float("inf"))
    assert fails(best) and len(best.requests) == 1 and best.delays == {} and n == len(tries)
    r = best.requests[0]
    assert list(r.extra) == ["bad_words"] and r.temperature == 0 and r.abort_after is None and r.arrival == 0
    assert r.max_new_tokens == 1 and len(r.prompt_ids) <= 9 and best.size() < case.size()


def test_a_failure_that_misses_gets_a_second_run_per_try():
    """A fake timing-dependent failure: a case with bad_words fails, but never on its first run. With
    one run a try every smaller case is dropped for its miss; with two, the shrinker gets to one
    request."""
    case = next(c for c in _draw(60, seed=5) if any("bad_words" in r.extra for r in c.requests)
                and len(c.requests) > 3)
    seen = []

    def misses_first(c):  # fails only when run again right after a run of the same try
        again = bool(seen) and seen[-1] is c
        seen.append(c)
        return again and any("bad_words" in r.extra for r in c.requests)
    once, n1 = shrink(case, misses_first, float("inf"))
    assert once.size() == case.size() and n1 > 0
    seen.clear()
    twice, n2 = shrink(case, misses_first, float("inf"), runs=2)
    assert len(twice.requests) == 1 and "bad_words" in twice.requests[0].extra
    assert n2 < len(seen) <= 2 * n2  # a try that failed on its first run got no second


def test_the_request_a_failure_names_is_tried_alone_first():
    case = next(c for c in _draw(60, seed=5) if len(c.requests) > 5)
    rid = case.requests[-2].rid
    tried = []

    def fails(c):  # a divergence of `rid`, whatever runs beside it
        tried.append([r.rid for r in c.requests])
        return any(r.rid == rid for r in c.requests)
    best, n = shrink(case, fails, float("inf"), focus=["c99r0", rid])
    assert tried[0] == [rid] and [r.rid for r in best.requests] == [rid]
    plain, m = shrink(case, fails, float("inf"))
    assert [r.rid for r in plain.requests] == [rid] and tried[n] != [rid]


def test_the_shrinker_stops_at_its_deadline():
    import time
    case = _draw(8)[-1]
    best, n = shrink(case, lambda c: True, time.monotonic() - 1)
    assert n == 0 and best.size() == case.size()


class FakeTarget:
    name, seed = "vllm", 0

    def payload(self, r, overlap):
        from harness.targets.served.pair import ServedTarget
        return ServedTarget.payload(self, r, overlap)

    def model_name(self):
        return "m"


def test_a_reproducer_round_trips_in_the_fixture_format(tmp_path):
    case = _draw(15, seed=11)[-1]
    f = Finding("divergence", "request c0r0 diverges", ("divergence",))
    d = served_repro.reproducer(FakeTarget(), case, f, seed=7, patches=["max_tokens_counts_placeholders"],
                                version="0.32.0")
    assert {"id", "what", "upstream", "requests", "counters"} <= set(d)  # fixtures/vllm_upstream's keys
    assert all("model" not in b and "prompt" in b and "max_tokens" in b for b in d["requests"])
    path = served_repro.write(str(tmp_path / "r.json"), d)
    d2, back = served_repro.load(path)
    assert d2["harness"]["patches"] == ["max_tokens_counts_placeholders"] and back.delays == case.delays
    assert back.controls == [tuple(c) for c in case.controls]
    t = FakeTarget()
    for a, b in zip(case.requests, back.requests):  # the same bodies go to the servers
        assert t.payload(a, True) == t.payload(b, True) and (a.arrival, a.abort_after) == (b.arrival, b.abort_after)


def test_a_bad_reproducer_is_one_line(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"id": "x", "requests": []}')
    with pytest.raises(served_repro.BadServedRepro, match="not a served-target reproducer"):
        served_repro.load(str(p))
    p.write_text('{"requests": [{"prompt": [1]}], "harness": {"format": "%s", "rids": []}}' % served_repro.FORMAT)
    with pytest.raises(served_repro.BadServedRepro, match="one length"):
        served_repro.load(str(p))


def test_the_upstream_fixture_of_the_seeded_preemption_is_a_served_reproducer():
    from harness.targets.vllm import upstream as vllm_upstream
    k = next(k for k in vllm_upstream.KNOWN_UPSTREAM if k.id == "async-seeded-preempt-in-flight")
    d, case = served_repro.load(k.reproducer)
    assert len(case.requests) == 1 and case.controls and d["harness"]["verdict"]["kind"] == "divergence"
    assert k.codes == ("divergence.sampled_preempted",)  # what served_judge codes a sampled, preempted request's


def test_known_upstream_claims_only_its_own_findings():
    seeded = Finding("divergence", "request c0r0 diverges at token 0 (x): off [1] vs on [2] (a sampled request "
                     "preempted async on)", ("divergence",), "divergence.sampled_preempted", "c0r0")
    plain = Finding("divergence", "request c0r1 diverges at token 3 (x): off [1] vs on [2]", ("divergence",),
                    "divergence", "c0r1")
    # the entry's mechanism counted by the agent for that request: its in-flight sample dropped on the reset path
    v = Verdict(new=[seeded, plain], counts_on={"cpu_generator_rewinds": 2},
                evidence={seeded.summary: {"stale_dropped:reset": 1}})
    _classify(v, "0.32.0")
    assert v.new == [plain]
    assert {k for k, _ in v.known} == {"async-seeded-preempt-in-flight", "cpu-seeded-partial-prefill"}
    past = Finding("steps", "steps: request c0r0: 3 sampling steps async on, 2 off (...): 1 step(s) past max_tokens",
                   ("steps", "past max_tokens"), "steps.past_cap", "c0r0")
    v = Verdict(new=[past], evidence={past.summary: {"scheduled_at_cap": 1}})
    _classify(v, "0.32.0")  # fixed in 0.12.0: new here
    assert v.new == [past]
    v = Verdict(new=[past], evidence={past.summary: {"scheduled_at_cap": 1}})
    _classify(v, "0.11.0")
    assert v.new == [] and v.known[0][0] == "async-step-past-max-tokens"
    bare = Finding("placeholders", "async on: a logits processor read 3 placeholder(s)", ("placeholders", "x"))
    v = Verdict(new=[bare], counts_on={"lp_no_repeat_placeholder_reads": 3})
    _classify(v, "0.32.0")  # vllm#52461 is the bare pair's: on the main pair it is new
    assert v.new == [bare]


def test_known_upstream_is_per_runner():
    """V1-runner entries (a generator rewound on the host, placeholders repaired in InputBatch) have
    no code on V2: there the same-looking finding is new, and the gate does not call the entry
    gone (the 0.33.0/0.34.0 V2 gates printed "cpu-seeded-partial-prefill: no longer reproduces")."""
    from harness.targets.vllm import upstream as vllm_upstream
    seeded = Finding("divergence", "request c0r0 diverges at token 0 (x): off [1] vs on [2] (a sampled request "
                     "preempted async on)", ("divergence",), "divergence.sampled_preempted", "c0r0")
    for runner, claimed in (("v1", True), (None, True), ("v2", False)):
        v = Verdict(new=[seeded], evidence={seeded.summary: {"stale_dropped:reset": 1}})
        _classify(v, "0.33.0", runner)
        assert (v.new == []) is claimed, (runner, v.new)
    row = "seeded_partial_prefill"
    assert vllm_upstream.classify(row, [], version="0.33.0", runner="v1")[2] == ["cpu-seeded-partial-prefill"]
    assert vllm_upstream.classify(row, [], version="0.33.0", runner="v2")[2] == []
    crash = "RuntimeError: CPU Generator does not use offset"
    assert vllm_upstream.classify(row, [crash], version="0.33.0", runner="v2")[0] == [crash]


@pytest.mark.parametrize("argv,msg", [
    (["--target", "vllm", "--url", "http://x"], "--url / --url-off apply to --target openai only"),
    (["--target", "openai", "--url", "http://x"], "needs --url (overlap on) and --url-off"),
    (["--target", "openai", "--url", "a", "--url-off", "b", "--fault", "f"], "--fault applies to --target ref or vllm"),
    (["--target", "vllm", "--fault", "nope"], "unknown fault nope for target vllm"),
    (["--target", "vllm", "--minutes", "0"], "--minutes must be a positive number"),
    (["--target", "vllm", "--cases-per-run", "0"], "--cases-per-run must be between 1 and 16"),
    (["--target", "vllm", "--shard", "2/2"], "bad --shard"),
    (["--target", "vllm", "--vllm-version", "9.9.9"], "--vllm-version"),
    (["--vllm-version", "0.32.0"], "applies to a served target"),
])
def test_bad_flags_are_one_line_and_exit_2(argv, msg, capsys, tmp_path):
    from harness.cli import main
    assert main(["stress", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0], err


def test_replay_of_a_ref_reproducer_with_target_vllm_is_refused(tmp_path, capsys):
    from harness.cli import main
    p = tmp_path / "r.json"
    p.write_text('{"format": "overlap-harness-repro"}')
    assert main(["replay", str(p), "--target", "vllm"]) == 2
    assert "not a served-target reproducer" in capsys.readouterr().err


def test_a_reproducer_that_does_not_replay_falls_back_on_one_that_does(tmp_path):
    """A timing-dependent failure: every case that keeps request c0r0 with bad_words fails, and any
    other case fails once, by luck, then never again. Shrinking keeps the lucky steps (one run
    each), so the smallest case does not replay; the reproducer written is the one that replays
    most often (here the case as found, 3 of 3), with its rate."""
    from harness.search.served import explore as ss
    case = next(c for c in _draw(30, seed=5) if len(c.requests) >= 4)
    case.requests[0].extra["bad_words"] = [" the"]
    lucky = set()

    def fails(c):
        if any(r.rid == case.requests[0].rid and r.extra.get("bad_words") for r in c.requests):
            return True
        key = ss._key(c)
        if key in lucky:
            return False
        lucky.add(key)
        return True

    class Flaky(ss.ServedStress):
        def judge(self, c):
            return Verdict(new=[Finding("divergence", "d", ("divergence",))] if fails(c) else [])

    s = Flaky(FakeTarget(), Tok(), seconds=60, out=str(tmp_path), shrink_seconds=30)
    s._t0 = 0.0
    s._new_finding(case, Verdict(new=[Finding("divergence", "d", ("divergence",))]))
    f = s.res.found[0]
    assert lucky  # some shrinking step failed by luck and was kept ...
    assert case.requests[0].rid in [r.rid for r in f.best.requests]  # ... but is not what was written
    assert f.replay_same and f.replays == ss.REPLAY_TRIES
    d, back = served_repro.load(f.repro)
    assert d["harness"]["found"]["replays"] == f"{ss.REPLAY_TRIES} of {ss.REPLAY_TRIES}" and fails(back)


def test_replay_tries_below_one_is_one_line_before_a_server_starts(tmp_path, capsys):
    from harness.cli import main
    case = _draw(5, seed=11)[-1]
    d = served_repro.reproducer(FakeTarget(), case, Finding("divergence", "d", ("divergence",)), seed=7)
    path = served_repro.write(str(tmp_path / "r.json"), d)
    assert main(["replay", path, "--target", "vllm", "--tries", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--tries must be at least 1") and not any("starting" in e for e in err), err


def test_a_crash_signature_does_not_name_the_request():
    """A crash that names vLLM's request id (a KeyError on it) must give the same signature on
    replay, where the id is new (the output_index_map_shared search's reproducer did not replay)."""
    from harness.search.served.judge import _exception
    a = _exception("CRASH: vllm (overlap on) exited with code 0 while x ran: KeyError: 'cmpl-8fb273866332d9ca-0-85fb76ba' (log /a)")
    b = _exception("CRASH: vllm (overlap on) exited with code 0 while x ran: KeyError: 'cmpl-93ab00ff1234abcd-0-1a2b3c4d' (log /b)")
    assert a == b == "KeyError: 'cmpl-X'"
    assert _exception("ran: AssertionError: assert x >= 0 (a.py:71)") != _exception("ran: AssertionError: assert y (a.py:9)")


def test_a_look_alike_of_a_known_bug_without_its_mechanism_is_new():
    """Issue 36: a known entry claims a finding only with its own mechanism counted for that
    request. The same wording with the in-flight sample dropped on the KV-pressure path (not the
    reset path the entry records), or with nothing counted, is new and says why."""
    said = ("request c0r0 diverges at token 0 (x): off [1] vs on [2] (a sampled request preempted async on)")
    for ev, counted in (({"stale_dropped:kv_pressure": 1}, "counted: stale_dropped:kv_pressure 1"), ({}, "")):
        f = Finding("divergence", said, ("divergence",), "divergence.sampled_preempted", "c0r0")
        v = Verdict(new=[f], evidence={said: ev})
        _classify(v, "0.32.0")
        assert v.known == [] and len(v.new) == 1, v
        assert v.new[0].summary.startswith(said + " (looks like known upstream async-seeded-preempt-in-flight, but "
                                           "its mechanism (stale_dropped:reset) was not counted"), v.new[0].summary
        assert counted in v.new[0].summary
    past = Finding("steps", "steps: request c0r0: 3 sampling steps async on, 2 off (...): 1 step(s) past max_tokens",
                   ("steps", "past max_tokens"), "steps.past_cap", "c0r0")
    v = Verdict(new=[past])
    _classify(v, "0.11.0")  # in its range, but the request was never scheduled with its last token in flight
    assert v.known == [] and "looks like known upstream async-step-past-max-tokens" in v.new[0].summary


def test_no_known_entry_claims_by_wording_alone():
    from harness.targets.vllm import upstream as vp
    alone = [k.id for k in vp.KNOWN_UPSTREAM if vp.claims_by_wording_alone(k)]
    assert alone == [], f"known entries that would claim a finding by its text alone: {alone}"
    injected = vp.KnownUpstream("x", "stress", "-", "", "-", codes=("divergence",))
    assert vp.claims_by_wording_alone(injected)


def test_a_refused_case_is_said_with_the_servers_answer():
    """A drawn case the server refuses (400) is not judged: the summary says why, so the generator
    can be fixed, instead of a bare count."""
    from types import SimpleNamespace

    from harness.search.served.explore import ServedStress, ServedStressResult, summary_lines
    s = SimpleNamespace(res=ServedStressResult(), agent=False)
    case = _draw(1)[0]
    why = "vllm: request c0r1 refused with 400: prompt_logprobs is not supported with streaming"
    for _ in range(2):
        ServedStress._count(s, case, Verdict(refused=why))
    lines = summary_lines(s)
    assert "(2 refused)" in lines[0] and lines.count(f"refused (not judged): {why}") == 1, lines


def test_answers_the_server_failed_are_counted_in_the_summary():
    """An answer the server failed (a 5xx or an error event mid-stream) is judged by its ids only;
    the summary counts them and names the first distinct ones, so coverage lost to a draw the
    engine fails is seen, not silent; a run without one says nothing."""
    from types import SimpleNamespace

    from harness.search.served.explore import ServedStress, ServedStressResult, summary_lines
    s = SimpleNamespace(res=ServedStressResult(), agent=False, config=None)
    case = _draw(1)[0]
    ServedStress._count(s, case, Verdict())
    assert not any(ln.startswith("server errors") for ln in summary_lines(s))
    what = "server error 500: Internal server error"
    for _ in range(2):
        ServedStress._count(s, case, Verdict(server_errors=[("off", "c0r0", what), ("on", "c0r0", what)]))
    got = [ln for ln in summary_lines(s) if ln.startswith("server errors")]
    assert len(got) == 1 and ": 4; request c0r0 async off: " + what in got[0], got


def test_prompt_logprobs_lost_on_a_reset_are_known_only_with_the_reset_drop_counted():
    """The first 20-minute stress of the current build (stock 0.32.0, small-budget): async on, a
    request got 1 prompt-logprob entry of 88. Known (reported new) only with the reset's drop of
    its in-flight step counted for it; the same wording without it is new."""
    said = "request c3r0: async on: 1 prompt_logprobs entries for 88 prompt tokens (first None)"
    # issue 44: the drop must be of the step that carries the prompt logprobs (its last prompt
    # chunk's: `stale_dropped_prompt`); a reset that dropped a later decode step lost none of them
    for ev, known in (({"stale_dropped:reset": 1, "stale_dropped_prompt:reset": 1}, True),
                      ({"stale_dropped:reset": 1}, False),
                      ({"stale_dropped:kv_pressure": 1, "stale_dropped_prompt:kv_pressure": 1}, False), ({}, False)):
        v = Verdict(new=[Finding("surface", said, ("surface", "prompt_logprobs"), "surface.prompt_logprobs_count.on",
                                 "c3r0")], evidence={said: ev})
        _classify(v, "0.32.0")
        assert (v.known == [("async-prompt-logprobs-dropped-on-reset", said)]) == known, (ev, v)
        assert (v.new == []) == known


def test_a_forced_token_is_never_drawn_against_a_grammar():
    """boost forces its token past every mask, a grammar's too: vLLM fails such a request in both
    arms (an error event mid-stream; the first 20-minute stress of 12-05 filed it as a stream
    without usage), so the draw gives a request with a regex another processor."""
    both = []
    find(sc.requests(Tok(), "r0"), lambda r: (r.extra.get("structured_outputs") and r.extra.get("vllm_xargs")
                                            and both.append(r)) or len(both) >= 20,
         settings=settings(database=None, max_examples=5000, phases=[Phase.generate],
                           suppress_health_check=list(HealthCheck)), random=random.Random(5))
    lps = {k for r in both for k in r.extra["vllm_xargs"]}
    assert len(both) >= 20 and sc.XARGS["boost"] not in lps and len(lps) >= 2, lps


def test_a_pause_is_sent_in_the_releases_own_words():
    """Before 0.16.0 vLLM's /pause takes no `mode`: it ignored ?mode=keep and aborted every running
    request (the 0.13.0 sweep's stress filed such a cut answer, off [6082] vs on [], as a divergence).
    There a pause_wait is sent as wait_for_inflight_requests, an abort as the bare /pause, and the keep
    pause, which it has not, is not sent (said n/a); from 0.16.0 each goes as its mode."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from types import SimpleNamespace

    from harness.search.served import judge
    from harness.targets.vllm import releases as vr
    from harness.targets.vllm.target import VllmTarget
    posted = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            posted.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        def sent(version):
            posted.clear()
            t = SimpleNamespace(release=vr.release(version), url=lambda overlap: f"http://127.0.0.1:{srv.server_port}")
            t.pause_path = lambda mode: VllmTarget.pause_path(t, mode)
            got = []
            judge._controls(t, True, [(0.0, "pause"), (0.0, "pause_wait"), (0.0, "pause_abort")], threading.Event(), got)
            return list(posted), got
        paths, got = sent("0.13.0")
        assert paths == ["/pause?wait_for_inflight_requests=true", "/resume", "/pause", "/resume"], paths
        assert got[0] == ("pause", "n/a")
        paths, _ = sent("0.16.0")
        assert paths == ["/pause?mode=keep", "/resume", "/pause?mode=wait", "/resume", "/pause?mode=abort", "/resume"]
    finally:
        srv.shutdown()


def test_a_crash_the_pair_named_is_claimed_in_stress_too():
    """The 0.11.0 sweep's stress: the async-on engine died on vllm#26467 (a penalty indexes the logits
    with the -1 placeholder), the pair's CRASH line named it, and stress filed it as new. In its range
    the entry claims that death; from 0.11.1 (fixed) the same death is new."""
    line = ("async on: CRASH (KNOWN UPSTREAM vllm#26467): vllm (overlap on) exited with code 0 while outside the "
            "suites ran: RuntimeError: Worker failed with error 'index -1 is out of bounds for dimension 1 with size "
            "49153', please check the stack trace above for the root cause")
    crash = Finding("crash", line, ("crash", "on", "RuntimeError: x"))
    v = Verdict(new=[crash])
    _classify(v, "0.11.0")
    assert v.new == [] and [k for k, _ in v.known] == ["vllm#26467"], (v.new, v.known)
    v = Verdict(new=[Finding("crash", line, ("crash", "on", "RuntimeError: x"))])
    _classify(v, "0.11.1")
    assert len(v.new) == 1 and not v.known
