"""Multi-turn chat and client-set request ids in the served search (issue 36, item 2), without a
server: the draws (harness.search.served_chat), the conversation client over a real httpx client
whose transport answers as vLLM's chat API does (harness.targets.served.chat_turns), the turn-by-turn
judging (harness.oracles.turns) and the request-id oracle (harness.oracles.request_ids), each with
a fault it must catch and the correct answers it must leave quiet. Against vLLM itself:
`stress --target vllm` (docs/stress.md, figures in docs/vllm-paths.md)."""
import functools
import json
import random

import httpx
from hypothesis import HealthCheck, Phase, find, settings

from harness.engine.request import Request
from harness.oracles import request_ids, turns
from harness.search import served_case as sc
from harness.search import served_chat
from harness.search.served_case import ServedCase
from harness.search.served_judge import _findings
from harness.targets.base import Run
from harness.targets.served.chat_turns import HEADER_KEY


class Tok:
    """A stand-in tokenizer: one id per character, a chat template of our own."""
    bos_id, add_bos = 1, True

    def encode(self, text):
        return [32 + (ord(c) % 200) for c in text]

    def apply_chat_template(self, messages):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


@functools.lru_cache(maxsize=None)  # one draw for every test that reads it (the CI budget): never mutated
def _draw(n=60, seed=3):
    got = []
    find(served_chat.submissions(Tok()), lambda c: got.append(c) or len(got) >= n,
         settings=settings(database=None, max_examples=300, phases=[Phase.generate],
                           suppress_health_check=list(HealthCheck)), random=random.Random(seed))
    return got


def test_the_search_draws_conversations_client_ids_and_duplicates():
    from harness.targets.vllm import paths as vp
    cases = _draw()
    feats = [f for c in cases for f in sc.case_features(c)]
    for want in ("chat", "request_id", "x-request-id", "duplicate_id"):
        assert feats.count(want) >= 1, (want, sorted(set(feats)))
    for c in cases:
        for r in c.requests:
            if r.extra.get("chat"):  # 2-3 turns, one client thread, no one-shot field
                assert 2 <= len(r.extra["chat"]) <= 3 and r.n == 1 and r.abort_after is None
                assert not {"prompt_logprobs", "stream", "structured_outputs"} & set(r.extra)
                assert r.prompt_ids == Tok().encode(Tok().apply_chat_template(
                    [{"role": "user", "content": r.extra["chat"][0]}]))
                if not r.shared_prefix:  # (one id per character here: the prefix's 469 are 93 tokens)
                    assert len(r.prompt_ids) + 3 * (r.max_new_tokens + 40) <= vp.MAX_MODEL_LEN
        for cid, group in request_ids.groups(c.requests).items():
            if len(group) < 2:
                assert "-dup-" not in cid
                continue
            a, b = group  # a pair sent together, both running to length, told apart by their lengths
            assert "-dup-" in cid and a.arrival == b.arrival and b.abort_after is None
            assert all(request_ids.runs_to_length(r) for r in group)
            assert len(a.prompt_ids) != len(b.prompt_ids) and a.max_new_tokens != b.max_new_tokens
            assert a.abort_after is None or 1 <= a.abort_after < a.max_new_tokens
    # a disconnecting client reads a stream: never with prompt_logprobs (vLLM refuses them on a stream)
    assert not any(r.abort_after is not None and "prompt_logprobs" in r.extra for c in cases for r in c.requests)
    groups = [g for c in cases for g in request_ids.groups(c.requests).values() if len(g) > 1]
    assert any(g[0].abort_after for g in groups) and any(not g[0].abort_after for g in groups)


def _chat_server(answers: dict, seen: list):
    """A transport that answers like vLLM's chat API: the ids of the answer to the conversation's
    last user message (`answers`: user text -> ids), with top-5 records as "token_id:N"."""
    def handle(req: httpx.Request):
        body = json.loads(req.content)
        seen.append((req.url.path, body, req.headers.get("x-request-id")))
        ids = answers[body["messages"][-1]["content"]][:body["max_tokens"]]
        lp = [{"token": f"token_id:{i}", "logprob": -0.1, "top_logprobs": [{"token": f"token_id:{i}", "logprob": -0.1},
                                                                         {"token": "token_id:7", "logprob": -3.0}]}
              for i in ids]
        return httpx.Response(200, json={"id": f"chatcmpl-{req.headers.get('x-request-id') or body.get('request_id')}",
                                         "choices": [{"index": 0, "finish_reason": "length", "stop_reason": None,
                                                      "message": {"role": "assistant", "content": f"ans{ids}"},
                                                      "logprobs": {"content": lp}}],
                                         "usage": {"prompt_tokens": 0, "completion_tokens": len(ids)}})
    return httpx.MockTransport(handle)


def test_a_conversation_appends_each_answer_and_comes_back_turn_by_turn():
    from harness.targets.served.chat_turns import send_conversation

    class T:
        name, surface = "vllm", {}

        def tokenizer(self):
            return Tok()
    t, seen = T(), []
    r = Request(rid="c0r0", prompt_ids=[1], max_new_tokens=3)
    body = {"model": "m", "prompt": [1], "max_tokens": 3, "logprobs": 5, "return_tokens_as_token_ids": True,
            "chat": ["hi", "and then"], "request_id": "mine"}
    with httpx.Client(transport=_chat_server({"hi": [4, 5, 6], "and then": [8, 9]}, seen)) as c:
        got = send_conversation(t, c, "http://x", r, body, {"X-Request-Id": "hdr"})
    assert [(rid, ids, fin) for rid, ids, fin, _ in got] == [("c0r0@1", [4, 5, 6], "length"), ("c0r0@2", [8, 9], "length")]
    assert got[0][3][0] == (-0.1, [(4, -0.1), (7, -3.0)])
    (p1, b1, h1), (p2, b2, h2) = seen
    assert p1 == p2 == "/v1/chat/completions" and h1 == h2 == "hdr" and "prompt" not in b1 and "chat" not in b1
    assert b1["logprobs"] is True and b1["top_logprobs"] == 5 and b1["request_id"] == "mine"
    assert b2["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ans[4, 5, 6]"},
                              {"role": "user", "content": "and then"}]
    s = t.surface["c0r0@2"]
    assert s["turn"] == 2 and s["id"] == "chatcmpl-hdr" and s["prompt_ids"] == Tok().encode(
        Tok().apply_chat_template(b2["messages"]))


def _run(rows):
    """rows: (rid, ids, finish, surface fields or None)"""
    run = Run(outputs=[(rid, ids, fin) for rid, ids, fin, _ in rows])
    run.logprobs = {rid: [(-0.1, [(i, -0.1), (999, -5.0)]) for i in ids] for rid, ids, _, _ in rows}
    run.surface = {rid: f for rid, _, _, f in rows if f is not None}
    return run


def _turn(ids, prompt_len, text=None):
    return {"text": text if text is not None else "".join(f"<{i}>" for i in ids), "stop_reason": None,
            "usage": {"prompt_tokens": prompt_len, "completion_tokens": len(ids)}, "prompt_ids": [0] * prompt_len}


def _decode(ids, prompt=(), skip_special_tokens=True):
    return "".join(f"<{i}>" for i in ids)


def _conv():
    r = Request(rid="c0r0", prompt_ids=[0] * 10, max_new_tokens=3)
    r.extra, r.n = {"chat": ["a", "b", "c"]}, 1
    return ServedCase([r], {}, [], 1)


def _judge(case, off_rows, on_rows):
    off, on, counts = turns.comparable(_run(off_rows), _run(on_rows))
    return _findings(case, {"run": off}, {"run": on}, agent=False, decode=_decode), counts


def test_turns_after_the_arms_first_difference_are_left_out():
    """Equal conversations: every turn judged, quiet. A clear difference at turn 2: that turn is the
    finding, and turn 3 (another prompt in each arm, its ids differ too) is left out and counted,
    not a second finding."""
    case = _conv()
    same = [("c0r0@1", [4, 5, 6], "length", _turn([4, 5, 6], 10)), ("c0r0@2", [8, 9, 9], "length", _turn([8, 9, 9], 20)),
            ("c0r0@3", [1, 2, 3], "length", _turn([1, 2, 3], 30))]
    found, counts = _judge(case, same, same)
    assert found == [] and counts["turns"] == 3 and counts["left_out"] == 0
    other = same[:1] + [("c0r0@2", [8, 6, 6], "length", _turn([8, 6, 6], 20)),
                        ("c0r0@3", [5, 5, 5], "length", _turn([5, 5, 5], 30))]
    found, counts = _judge(case, same, other)
    assert [f.kind for f in found] == ["divergence"] and "request c0r0@2 diverges at token 1" in found[0].summary
    assert counts == {"conversations": 1, "turns": 2, "left_out": 2, "cut": {"c0r0": 2}}
    assert "2 later turn(s) not comparable" in turns.line(counts) and "c0r0 after turn 2" in turns.line(counts)


def test_each_turn_gets_the_surface_oracle():
    """A turn whose usage counts the prompt of the turn before (the answer lost from the
    conversation) or whose text is not its ids' is caught, per turn."""
    case = _conv()
    off = [("c0r0@1", [4, 5, 6], "length", _turn([4, 5, 6], 10)), ("c0r0@2", [8, 9, 9], "length", _turn([8, 9, 9], 20))]
    on = off[:1] + [("c0r0@2", [8, 9, 9], "length", {**_turn([8, 9, 9], 20), "usage": {"prompt_tokens": 10,
                                                                                       "completion_tokens": 3}})]
    found, _ = _judge(case, off, on)
    assert [f.signature for f in found] == [("surface", "usage.prompt_tokens")], found
    assert "request c0r0@2: async on: usage.prompt_tokens 10, the prompt has 20 tokens" in found[0].summary
    bad_text = off[:1] + [("c0r0@2", [8, 9, 9], "length", _turn([8, 9, 9], 20, text="<8><9>"))]
    found, _ = _judge(case, off, bad_text)
    assert {f.signature for f in found} == {("surface", "text")}


def _pair(abort=None, where="request_id"):
    a = Request(rid="c0r0", prompt_ids=[5] * 12, max_new_tokens=8, ignore_eos=True, abort_after=abort)
    b = Request(rid="c0r1", prompt_ids=[6] * 11, max_new_tokens=10, ignore_eos=True)
    for r in (a, b):
        r.extra, r.n = {where: "oh-dup-c0"}, 1
    return [a, b]


def _answer(r, ids, fin="length", prompt=None, rid_id="cmpl-oh-dup-c0"):
    return (r.rid, ids, fin, {"text": None, "stop_reason": None, "id": rid_id,
                              "usage": {"prompt_tokens": len(r.prompt_ids) if prompt is None else prompt,
                                        "completion_tokens": len(ids)}})


def test_a_duplicate_id_each_client_gets_its_own_whole_answer():
    """Correct (each its own answer, the survivor whole beside a disconnect): quiet. Faults: the
    survivor cut when the other client left (an abort keyed by the client id), an answer crossed
    between the two clients, a response id that carries the client's id in one arm only."""
    a, b = _pair(abort=3, where=HEADER_KEY)
    good = [(a.rid, [1, 2, 3], "abort", None), _answer(b, list(range(10)))]
    assert request_ids.findings([a, b], _run(good), _run(good)) == {}
    case = ServedCase([a, b], {}, [], 1)
    assert _findings(case, {"run": _run(good)}, {"run": _run(good)}, agent=False) == []
    cut = [(a.rid, [1, 2, 3], "abort", None), _answer(b, [0, 1, 2, 3], fin="abort")]
    got = request_ids.findings([a, b], _run(good), _run(cut))
    assert "async on: client id 'oh-dup-c0' shared with c0r0 (disconnected after 3): ended abort after 4 of 10" in \
        got["c0r1"][0] and "async off" not in " ".join(got["c0r1"])
    found = _findings(case, {"run": _run(good)}, {"run": _run(cut)}, agent=False)
    assert ("request_id", "cut short") in {f.signature for f in found}
    a, b = _pair()
    good = [_answer(a, list(range(8))), _answer(b, list(range(10)))]
    crossed = [_answer(a, list(range(8)), prompt=11), _answer(b, list(range(10)), prompt=12)]
    got = request_ids.findings([a, b], _run(crossed), _run(crossed))
    assert "usage.prompt_tokens 11 is c0r1's prompt, not its own 12" in got["c0r0"][0] and len(got["c0r0"]) == 2
    lost = [_answer(a, list(range(8)), rid_id="cmpl-3f9a"), _answer(b, list(range(10)))]
    got = request_ids.findings([a, b], _run(good), _run(lost))
    assert got == {"c0r0": ["response id carries the client's id 'oh-dup-c0' async off only"]}
    assert request_ids.counts([a, b]) == {"body": 2, "header": 0, "duplicate_groups": 1, "duplicate_aborts": 0}


def test_the_shrinker_drops_a_turn():
    from harness.search.served_shrink import _request_variants
    r = _conv().requests[0]
    assert any(v.extra.get("chat") == ["a", "b"] for v in _request_variants(r))


def test_an_abort_pause_judges_the_cut_answers_as_prefixes():
    """/pause?mode=abort cuts the arms' answers at different points (timing): both cut to their
    common length, quiet when one is a prefix of the other, a divergence when the tokens inside
    differ; a duplicate-id survivor cut by the pause is no request-id finding; a case without the
    control is judged whole."""
    from harness.oracles import pause_abort
    a, b = _pair()
    case = ServedCase([a, b], {}, [(0.2, "pause_abort")], 1)
    off = [_answer(a, [1, 2, 3, 4, 5], fin="abort"), _answer(b, list(range(10)))]
    on = [_answer(a, [1, 2, 3], fin="abort"), _answer(b, list(range(6)), fin="abort")]
    o, n, cut = pause_abort.comparable(case, _run(off), _run(on))
    assert cut == {"c0r0", "c0r1"} and o.outputs == n.outputs == [("c0r0", [1, 2, 3], "abort"),
                                                                   ("c0r1", list(range(6)), "abort")]
    assert _findings(case, {"run": o, "cut": cut}, {"run": n, "cut": cut}, agent=False) == []
    wrong = [_answer(a, [1, 9, 3], fin="abort"), on[1]]
    o, n, cut = pause_abort.comparable(case, _run(off), _run(wrong))
    found = _findings(case, {"run": o, "cut": cut}, {"run": n, "cut": cut}, agent=False)
    assert [f.kind for f in found] == ["divergence"] and "request c0r0 diverges at token 1" in found[0].summary
    plain = ServedCase([a, b], {}, [(0.2, "pause")], 1)
    o, n, cut = pause_abort.comparable(plain, _run(off), _run(on))
    assert cut == set() and o.outputs == _run(off).outputs
    # a client that meant to leave at 9 tokens, cut by the pause at 7 in one arm (its stream records
    # "stop", no server finish): judged as a prefix, not a divergence (the final build's stress)
    a.abort_after = 9
    off = [_answer(a, list(range(7)), fin="stop"), _answer(b, list(range(10)))]
    on = [_answer(a, list(range(9)), fin="abort"), _answer(b, list(range(10)))]
    o, n, cut = pause_abort.comparable(case, _run(off), _run(on))
    assert cut == {"c0r0"} and o.outputs[0] == n.outputs[0] == ("c0r0", list(range(7)), "abort")
    both = [_answer(a, list(range(9)), fin="abort"), _answer(b, list(range(10)))]
    assert pause_abort.comparable(case, _run(both), _run(both))[2] == set()  # both left at 9: their own
    # a stream the pause aborted before its first token ends with no finish reason (vLLM skips the
    # empty terminal chunk: stock 0.32.0, a 20-minute stress of 12-05): cut, not a duplicate-id finding
    a.abort_after = None
    b.ignore_eos, b.max_new_tokens = True, 1
    none = [_answer(a, list(range(8))), _answer(b, [], fin=None)]
    o, n, cut = pause_abort.comparable(case, _run(none), _run(none))
    assert cut == {"c0r1"}
    assert _findings(case, {"run": o, "cut": cut}, {"run": n, "cut": cut}, agent=False) == []
    assert request_ids.findings(case.requests, _run(none), _run(none)), "judged whole, it is a finding"


def test_a_drawn_parameter_that_changed_nothing_is_not_exercised():
    """allowed_token_ids is drawn on some requests; each is sent again without it (async off, the
    same seed for an unseeded sampled request) and the summary marks it not exercised when it
    changed no answer."""
    from harness.search import served_effects
    cases = _draw()
    drawn = [r for c in cases for r in c.requests if "allowed_token_ids" in r.extra]
    assert drawn and all(1 <= len(r.extra["allowed_token_ids"]) <= 8 for r in drawn)
    assert not any(r.extra.get(k) for r in drawn for k in served_effects.CONFLICTS)  # never a request with no token
    r = Request(rid="c0r0", prompt_ids=[5] * 6, max_new_tokens=4, temperature=1.0)
    r.extra, r.n = {"allowed_token_ids": [4, 5]}, 1
    q = Request(rid="c0r1", prompt_ids=[6] * 6, max_new_tokens=4, abort_after=2)
    q.extra, q.n = {"allowed_token_ids": [4, 5]}, 1
    case = ServedCase([r, q], {}, [], 1)

    class Off:
        name, seed, sent = "vllm", 7, []

        def __init__(self, answer):
            self.answer = answer

        def run(self, reqs, overlap):
            assert overlap is False
            self.sent += reqs
            return _run([(c.rid, self.answer, "length", None) for c in reqs])
    t = Off([4, 5, 4, 5])
    off = _run([("c0r0", [4, 5, 4, 5], "length", None), ("c0r1", [4, 5], "abort", None)])
    assert served_effects.check(t, case, off) == {("c0r0", "allowed_token_ids"): False}
    import zlib
    assert [c.rid for c in t.sent] == ["c0r0~no-allowed_token_ids"] and "allowed_token_ids" not in t.sent[0].extra
    assert t.sent[0].seed == (zlib.crc32(b"c0r0") ^ 7) & 0x7FFFFFFF
    assert served_effects.check(Off([9, 9, 9, 9]), case, off) == {("c0r0", "allowed_token_ids"): True}
    assert served_effects.check(t, case, off, cut={"c0r0"}) == {}
    assert "not exercised" in served_effects.line({"allowed_token_ids": [0, 3]})[0]
    assert "changed 2 of 3" in served_effects.line({"allowed_token_ids": [2, 3]})[0]
    assert "not exercised" not in served_effects.line({"allowed_token_ids": [2, 3]})[0]


def test_header_fields_leave_the_body_as_headers():
    """X-Request-Id and X-Vllm-Priority are taken out of the body (never sent as unknown fields);
    under the priority policy some requests send their priority as the header."""
    from harness.targets.served.chat_turns import PRIORITY_KEY, client_headers
    body = {"prompt": [1], HEADER_KEY: "oh-c0r0", PRIORITY_KEY: 2, "priority": 0}
    assert client_headers(body) == {"X-Request-Id": "oh-c0r0", "X-Vllm-Priority": "2"}
    assert body == {"prompt": [1], "priority": 0} and client_headers(body) == {}
    got = []
    find(served_chat.submissions(Tok(), priority=True), lambda c: got.append(c) or len(got) >= 40,
         settings=settings(database=None, max_examples=100, phases=[Phase.generate],
                           suppress_health_check=list(HealthCheck)), random=random.Random(5))
    heads = [r for c in got for r in c.requests if PRIORITY_KEY in r.extra]
    assert heads and all(r.extra[PRIORITY_KEY] == r.priority for r in heads)
    assert not any(PRIORITY_KEY in r.extra for c in _draw() for r in c.requests)  # fcfs: no priority at all


def test_a_reproducer_keeps_conversations_ids_and_the_new_controls(tmp_path):
    """A case with a conversation, client ids, a duplicate pair and an abort pause is written and
    read back to the same bodies (replay sends them as found)."""
    from harness.search import served_repro
    from harness.search.served_judge import Finding
    from harness.targets.served.pair import ServedTarget

    class Fake:
        name, seed = "vllm", 0

        def payload(self, r, overlap):
            return ServedTarget.payload(self, r, overlap)

        def model_name(self):
            return "m"
    reqs = [r for c in _draw() for r in c.requests]
    want = {"chat", "duplicate_id", "x-request-id"}
    case = ServedCase([next(r for r in reqs if f in sc.features(r)) for f in sorted(want)],
                      {}, [(0.2, "pause_abort"), (0.5, "pause_wait")], 1)
    d = served_repro.reproducer(Fake(), case, Finding("request_id", "request c0r1: x", ("request_id", "cut short")),
                                seed=1)
    _, back = served_repro.load(served_repro.write(str(tmp_path / "r.json"), d))
    assert back.controls == case.controls and want <= set(sc.case_features(back))
    for a, b in zip(case.requests, back.requests):
        assert Fake().payload(a, True) == Fake().payload(b, True)


def test_the_judge_wires_turns_pause_aborts_and_effects():
    """served_judge.judge on a target that answers from a table (no agent): the later turns of a
    conversation that differed are counted and left out, an abort pause's cut answers judged as
    prefixes, allowed_token_ids sent again without it async off; one finding, the turn that differed."""
    from harness.search.served_judge import judge
    conv = _conv().requests[0]
    allow = Request(rid="c1r0", prompt_ids=[3] * 5, max_new_tokens=4)
    allow.extra, allow.n = {"allowed_token_ids": [4, 5]}, 1
    cut = Request(rid="c2r0", prompt_ids=[2] * 5, max_new_tokens=6)
    cut.extra, cut.n = {}, 1
    case = ServedCase([conv, allow, cut], {}, [(0.0, "pause_abort")], 1)
    turn = lambda k, ids: (f"c0r0@{k}", ids, "length", _turn(ids, 10 * k))
    answers = {False: [turn(1, [4, 5, 6]), turn(2, [8, 9, 9]), turn(3, [1, 1, 1]), ("c1r0", [4, 5, 4, 5], "length", None),
                       ("c2r0", [7, 7, 7, 7], "abort", None)],
               True: [turn(1, [4, 5, 6]), turn(2, [8, 6, 6]), turn(3, [2, 2, 2]), ("c1r0", [4, 5, 4, 5], "length", None),
                      ("c2r0", [7, 7], "abort", None)]}

    class Table:
        name, seed, hung, crashed, sent = "vllm", 0, {}, {}, []

        def url(self, overlap):
            return "http://x"

        def run(self, reqs, overlap, delays=None):
            self.sent.append([r.rid for r in reqs])
            if reqs[0].rid.endswith("~no-allowed_token_ids"):
                return _run([(reqs[0].rid, [9, 9, 9, 9], "length", None)])
            return _run(answers[overlap])
    t = Table()
    v = judge(t, case, agent=False)
    assert [f.kind for f in v.new] == ["divergence"] and "request c0r0@2 diverges at token 1" in v.new[0].summary, v.new
    assert v.turns["turns"] == 2 and v.turns["left_out"] == 2 and v.server_aborted == 1
    assert v.effects == {("c1r0", "allowed_token_ids"): True} and t.sent[-1] == ["c1r0~no-allowed_token_ids"]


def test_a_turn_s_divergence_gets_its_own_evidence_and_the_known_entry_claims_it():
    """The agent keys its books by the prompt ids a client sent: a chat turn's are the template's
    (with the earlier answers), not its conversation's first prompt. A sampled turn preempted async
    on with its in-flight sample dropped by a prefix-cache reset is found with that evidence, and
    async-seeded-preempt-in-flight claims it; the same divergence without the books' preemption
    stays new (measured: a 15-minute stress's c0r0@2, before turns were keyed)."""
    from harness.agents.vllm.steps import FIELDS, request_key
    from harness.search.served_judge import Verdict, _classify
    case = _conv()
    case.requests[0].temperature = 0.8
    off = [("c0r0@1", [4, 5, 6], "length", _turn([4, 5, 6], 10)), ("c0r0@2", [8, 9, 9], "length", _turn([8, 9, 9], 20))]
    on = off[:1] + [("c0r0@2", [7, 7, 7], "length", _turn([7, 7, 7], 20))]
    key = request_key([0] * 20, 3)  # turn 2's prompt as sent

    def books(preempted, ev):
        rec = dict(zip(FIELDS, (key, 4, 3, 0, 0, preempted, "length", ev, 0, 0, 0, 0, 0, 0)))
        return {"t2": [rec[f] for f in FIELDS]}

    for preempted, ev, claimed in ((1, {"stale_dropped:reset": 1}, True), (0, {}, False)):
        o, n, _ = turns.comparable(_run(off), _run(on))
        evidence = {}
        found = _findings(case, {"run": o, "steps": {}, "books": {}, "counts": {}},
                          {"run": n, "steps": books(preempted, ev), "books": {}, "counts": {}},
                          agent=True, evidence=evidence, decode=_decode)
        div = [f for f in found if f.kind == "divergence"]
        assert len(div) == 1 and "request c0r0@2 diverges at token 0" in div[0].summary, found
        assert ("a sampled request preempted async on" in div[0].summary) == claimed, div[0].summary
        assert evidence[div[0].summary] == ev
        v = Verdict(new=div, evidence=evidence)
        _classify(v, "0.32.0", "v1")
        assert bool(v.known) == claimed and bool(v.new) != claimed, (v.known, v.new)
