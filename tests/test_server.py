"""The OpenAI-compatible server, through real HTTP on 127.0.0.1 (a free port per test module)."""
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.engine.config import EngineConfig
from harness.serve import make_server
from harness.stopping import end_process

CFG = EngineConfig(model="tiny", max_context=512, max_running=8)


@pytest.fixture(scope="module")
def srv():
    s = make_server(CFG).start()
    yield s
    s.shutdown()
    assert not s.engine_thread.is_alive()


def call(s, method, path, body=None, raw: bytes | None = None, timeout=120):
    c = http.client.HTTPConnection(s.host, s.port, timeout=timeout)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        c.request(method, path, body=data, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode()
        ctype = r.getheader("Content-Type", "")
        return r.status, (json.loads(text) if "json" in ctype else text)
    finally:
        c.close()


def complete(s, **kw):
    return call(s, "POST", "/v1/completions", {"model": "tiny", **kw})


def test_models_and_health(srv):
    st, body = call(srv, "GET", "/v1/models")
    assert st == 200 and body["data"][0]["id"] == "tiny"
    assert call(srv, "GET", "/health") == (200, {"status": "ok", "model": "tiny"})


def test_completion_greedy_is_deterministic_with_usage_and_logprobs(srv):
    st, a = complete(srv, prompt="The overlap scheduler", max_tokens=12, temperature=0, logprobs=3)
    assert st == 200, a
    ch = a["choices"][0]
    assert ch["finish_reason"] == "length" and a["usage"]["completion_tokens"] == 12
    lp = ch["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 12
    assert all(len(t) <= 3 for t in lp["top_logprobs"])
    assert all(x <= 0 for x in lp["token_logprobs"])
    # greedy: the chosen token is the most likely one
    assert all(abs(x - max(t.values())) < 1e-5 for x, t in zip(lp["token_logprobs"], lp["top_logprobs"]))
    st, b = complete(srv, prompt="The overlap scheduler", max_tokens=12, temperature=0)
    assert b["choices"][0]["text"] == ch["text"]


def test_stop_strings_cut_the_text(srv):
    _, full = complete(srv, prompt="abc", max_tokens=24, temperature=0)
    text = full["choices"][0]["text"]
    stop = next((text[i:i + 2] for i in range(3, len(text) - 2) if text[i:i + 2].isprintable()
                 and text.find(text[i:i + 2]) == i), None)
    if stop is None:
        pytest.skip("the tiny model's output has no printable pair to stop at")
    _, cut = complete(srv, prompt="abc", max_tokens=24, temperature=0, stop=[stop])
    ch = cut["choices"][0]
    assert ch["text"] == text[:text.find(stop)] and ch["finish_reason"] == "stop"


def test_n_seed_batch_and_token_prompts(srv):
    _, a = complete(srv, prompt=["hello", "world"], max_tokens=6, temperature=0.9, seed=7, n=2)
    assert [c["index"] for c in a["choices"]] == [0, 1, 2, 3]
    _, b = complete(srv, prompt=["hello", "world"], max_tokens=6, temperature=0.9, seed=7, n=2)
    assert [c["text"] for c in a["choices"]] == [c["text"] for c in b["choices"]]  # seeded: reproducible
    _, c = complete(srv, prompt=[104, 101, 108, 108, 111], max_tokens=6, temperature=0)
    _, d = complete(srv, prompt="hello", max_tokens=6, temperature=0)
    assert c["choices"][0]["text"] == d["choices"][0]["text"]  # token ids = the text's bytes


def test_chat_completion_uses_the_chat_template(srv):
    st, r = call(srv, "POST", "/v1/chat/completions",
                 {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0,
                  "logprobs": True, "top_logprobs": 2})
    assert st == 200, r
    m = r["choices"][0]
    assert m["message"]["role"] == "assistant" and isinstance(m["message"]["content"], str)
    assert len(m["logprobs"]["content"]) == 5
    # the template's prompt: <user>hi\n<assistant> plus BOS
    assert r["usage"]["prompt_tokens"] == 1 + len("<user>hi\n<assistant>")


def _sse(s, path, body):
    c = http.client.HTTPConnection(s.host, s.port, timeout=60)
    c.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("Content-Type").startswith("text/event-stream")
    raw = r.read().decode()
    c.close()
    events = [line[len("data: "):] for line in raw.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_streaming_completion_matches_the_plain_one(srv):
    _, plain = complete(srv, prompt="stream me", max_tokens=10, temperature=0)
    ev = _sse(srv, "/v1/completions", {"prompt": "stream me", "max_tokens": 10, "temperature": 0, "stream": True})
    assert "".join(e["choices"][0]["text"] for e in ev) == plain["choices"][0]["text"]
    assert ev[-1]["choices"][0]["finish_reason"] == "length"
    assert all(e["choices"][0]["finish_reason"] is None for e in ev[:-1])


def test_streaming_chat(srv):
    ev = _sse(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                                            "temperature": 0, "stream": True,
                                            "stream_options": {"include_usage": True}})
    assert ev[0]["choices"][0]["delta"]["role"] == "assistant"
    assert ev[-1]["usage"]["completion_tokens"] == 4
    assert any(e["choices"] and e["choices"][0]["finish_reason"] == "length" for e in ev)


@pytest.mark.parametrize("path,raw", [
    ("/v1/completions", b"{not json"),
    ("/v1/completions", b"[1, 2]"),
    ("/v1/completions", b""),
    ("/v1/completions", json.dumps({"max_tokens": 3}).encode()),  # no prompt
    ("/v1/completions", json.dumps({"prompt": 5}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 0}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": "3"}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "temperature": -1}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "top_p": 0}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "n": 0}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "logprobs": 9}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "stop": [""]}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x", "echo": True}).encode()),
    ("/v1/completions", json.dumps({"prompt": [1, 99999]}).encode()),
    ("/v1/completions", json.dumps({"prompt": "x" * 600}).encode()),  # longer than the context
    ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 100000}).encode()),  # over the context
    ("/v1/chat/completions", json.dumps({"messages": "hi"}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": [{"content": "no role"}]}).encode()),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}],
                                         "logprobs": 3}).encode()),
])
def test_malformed_requests_get_400_json_and_the_server_keeps_serving(srv, path, raw):
    st, body = call(srv, "POST", path, raw=raw)
    assert st == 400, body
    assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
    st, ok = complete(srv, prompt="still there?", max_tokens=2, temperature=0)
    assert st == 200 and ok["choices"][0]["finish_reason"] == "length"


def test_unknown_paths_and_methods(srv):
    assert call(srv, "GET", "/v2/nothing")[0] == 404
    assert call(srv, "POST", "/v1/nothing", {"prompt": "x"})[0] == 404
    st, body = call(srv, "DELETE", "/v1/completions")
    assert st == 405 and "error" in body


def test_64_concurrent_clients_lose_no_request(srv):
    prompts = [f"client {i}: " + "ab" * (i % 5) for i in range(64)]
    expected = {}
    for p in prompts[:8]:  # a sample answered alone first: batching must not change greedy answers
        expected[p] = complete(srv, prompt=p, max_tokens=8, temperature=0)[1]["choices"][0]["text"]
    barrier = threading.Barrier(64)

    def client(p):
        barrier.wait(timeout=60)
        stream = prompts.index(p) % 4 == 0
        if stream:
            ev = _sse(srv, "/v1/completions", {"prompt": p, "max_tokens": 8, "temperature": 0, "stream": True})
            return p, 200, "".join(e["choices"][0]["text"] for e in ev)
        st, body = complete(srv, prompt=p, max_tokens=8, temperature=0)
        return p, st, body["choices"][0]["text"] if st == 200 else body
    t = time.perf_counter()
    with ThreadPoolExecutor(64) as ex:
        results = list(ex.map(client, prompts))
    assert all(st == 200 for _, st, _ in results), [r for r in results if r[1] != 200][:3]
    assert len(results) == 64 and len({p for p, _, _ in results}) == 64
    for p, _, text in results:
        if p in expected:
            assert text == expected[p]
    assert time.perf_counter() - t < 120


def test_engine_crash_is_a_503_not_a_hang():
    s = make_server(CFG).start()
    try:
        def boom():
            raise RuntimeError("injected failure")
        s.engine_thread.eng.step = boom
        st, body = complete(s, prompt="x", max_tokens=2)
        assert st == 503 and "crashed" in body["error"]["message"]
        st, body = call(s, "GET", "/health")
        assert st == 503 and "injected failure" in body["error"]["message"]
        assert complete(s, prompt="y", max_tokens=2)[0] == 503
    finally:
        s.shutdown()


def test_serve_command_binds_localhost_and_stops(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "harness.cli", "serve", "--port", "0", "--max-context", "512"],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        line = p.stderr.readline()
        m = re.search(r"http://(127\.0\.0\.1):(\d+)", line)
        assert m, line
        c = http.client.HTTPConnection(m.group(1), int(m.group(2)), timeout=30)
        c.request("GET", "/health")
        assert c.getresponse().status == 200
        c.close()
    finally:
        end_process(p, grace=20)
        p.stderr.close()


def test_serve_bad_flags_are_one_line_errors(capsys):
    from harness.cli import main
    assert main(["serve", "--port", "70000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--port" in err[0]
    s = make_server(CFG)  # not started: holds the port
    try:
        assert main(["serve", "--port", str(s.port)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "cannot listen" in err[0]
    finally:
        s.close_socket()


def test_max_tokens_past_the_room_left_is_cut_to_it(srv):
    st, r = complete(srv, prompt="y" * 480, max_tokens=100, temperature=0)
    assert st == 200 and r["choices"][0]["finish_reason"] == "length"
    assert 0 < r["usage"]["completion_tokens"] < 100
