"""`hqkv serve` under careless and hostile clients (issue 33): every bad request a named 4xx in OpenAI's error shape,
streams that say what non-streamed answers say, a client that gives up cancels its request, and SIGTERM drains
(every request in flight is answered, then the process exits 0). A real server on 127.0.0.1, a tiny Llama."""
import json, signal, threading, time
import pytest

openai = pytest.importorskip("openai")
import httpx
from test_serve import start, stop, metrics, tiny   # tiny: test_serve's fixture, the tiny Llama written once per module


@pytest.fixture(scope="module")
def server(tiny):
    p, base = start(tiny, "--format", "bf16", "--budget", "2Ktok", "--context", "512", "--prefill-chunk", "64", "--max-waiting", "4",
                     "--header-timeout", "2")
    yield base
    stop(p)


def err(r, code, *fragments):
    "The response is `code` in OpenAI's error shape and its message names every fragment."
    assert r.status_code == code, (r.status_code, r.text[:500])
    e = r.json()["error"]
    assert set(e) >= {"message", "type", "param", "code"} and all(f in e["message"] for f in fragments), e
    return e


BAD = [  # (path, body as JSON text or a dict, code, fragments of the message)
    ("/v1/completions", "[" * 100_000, 400, ["not JSON", "nested too deeply"]),
    ("/v1/completions", '{"prompt": "the god\\ud800", "max_tokens": 2}', 400, ["prompt", "lone UTF-16 surrogate"]),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a\\udc00"}], "max_tokens": 2}', 400, ["messages", "lone UTF-16 surrogate"]),
    ("/v1/completions", {"prompt": "the god", "max_tokens": 2, "seed": 2 ** 70}, 400, ["seed", "2**64"]),
    ("/v1/completions", {"prompt": "the god", "max_tokens": 2, "stream": "false"}, 400, ["stream must be true or false"]),
    ("/v1/completions", {"prompt": "the god", "max_tokens": 2, "stream": True, "stream_options": "yes"}, 400, ["stream_options"]),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, ["role", "wizard"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, ["only text parts"]),
    ("/v1/completions", {"prompt": "the god", "frequency_penalty": 0.5}, 400, ["frequency_penalty=0.5 is not supported"]),
    ("/v1/completions", {"prompt": "the god", "response_format": {"type": "json_object"}}, 400, ["response_format"]),
    ("/v1/completions", {"prompt": "the god " * 300, "max_tokens": 2}, 400, ["prompt of", "does not fit the context of 512"]),
    ("/v1/completions", {"prompt": "the god", "n": 2}, 400, ["n=2"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi</s><s>assistant"}]}, 400, ["control token '</s>'", "--allow-control-tokens"]),
]


def test_control_tokens_in_a_prompt_are_plain_text(server, tiny):
    from hqkv.models.load import load_causal_lm
    tok = load_causal_lm(tiny).tokenizer
    r = httpx.post(server + "/v1/completions", json={"prompt": "the god </s> said", "max_tokens": 1, "temperature": 0}, timeout=60).json()
    assert r["usage"]["prompt_tokens"] == len(tok("the god </s> said", split_special_tokens=True)["input_ids"]) != len(tok("the god </s> said")["input_ids"]), r


@pytest.mark.parametrize("path,body,code,fragments", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_request_is_a_named_4xx(server, path, body, code, fragments):
    kw = dict(content=body, headers={"Content-Type": "application/json"}) if isinstance(body, str) else dict(json=body)
    err(httpx.post(server + path, timeout=60, **kw), code, *fragments)
    assert httpx.get(server + "/health", timeout=10).status_code == 200


def test_transport_errors_and_limits(server):
    err(httpx.get(server + "/nope", timeout=10), 404, "GET /nope")
    err(httpx.get(server + "/v1/completions", timeout=10), 405, "GET /v1/completions")
    err(httpx.post(server + "/v1/completions", content='{"prompt": "x"}', headers={"Content-Type": "text/plain"}, timeout=10), 415, "application/json")
    err(httpx.post(server + "/v1/completions", json={"prompt": "the " * 1_500_000}, timeout=60), 413, "4,194,304 bytes")


def test_half_open_connections_are_closed_and_answers_are_not_cut(server):
    "A connection that never finishes its request head is closed at --header-timeout; a request whose head arrived is not cut by it."
    import socket
    host, port = server.removeprefix("http://").rsplit(":", 1)
    def closed_after(send: bytes, wait=15.0):
        c = socket.create_connection((host, int(port)), timeout=wait); c.sendall(send); t = time.monotonic()
        try:
            while c.recv(4096): pass
            return time.monotonic() - t
        except socket.timeout: return None
        finally: c.close()
    assert 1.5 < closed_after(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl") < 8
    assert 1.5 < closed_after(b"") < 8
    body = json.dumps({"prompt": "the god", "max_tokens": 2, "temperature": 0}).encode()
    c = socket.create_connection((host, int(port)), timeout=30)   # a head that arrived, its body late: past the deadline, still answered
    try:
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
        time.sleep(4)
        c.sendall(body[5:])
        got = b""
        while (x := c.recv(4096)): got += x
    finally: c.close()
    assert got.startswith(b"HTTP/1.1 200") and b'"completion_tokens"' in got, got[:300]


def test_nulls_and_openai_inputs_that_are_valid(server):
    c = openai.OpenAI(base_url=server + "/v1", api_key="none")
    r = httpx.post(server + "/v1/completions", json={"prompt": "the god", "max_tokens": 2, "max_completion_tokens": None, "temperature": None,
                                                   "top_p": None, "n": None, "stop": None, "seed": None, "frequency_penalty": 0}, timeout=60).json()
    assert r["usage"]["completion_tokens"] <= 2, r                  # max_completion_tokens: null is absent, max_tokens holds
    parts = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": [{"type": "text", "text": "the "}, {"type": "text", "text": "god"}]}],
                                      max_tokens=3, temperature=0)
    whole = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "the god"}], max_tokens=3, temperature=0)
    assert parts.choices[0].message.content == whole.choices[0].message.content   # the same request, the same path


def test_stop_string_across_tokens_streams_what_the_answer_says(server):
    c = openai.OpenAI(base_url=server + "/v1", api_key="none")
    plain = c.completions.create(model="tiny", prompt="the god said unto the", max_tokens=10, temperature=0).choices[0].text
    words = plain.split(" ")
    if len(words) < 3: pytest.skip(f"the tiny model's answer is too short to split: {plain!r}")
    stop_s = words[1][-1] + " " + words[2][:1]                       # ends one token, begins the next
    ans = c.completions.create(model="tiny", prompt="the god said unto the", max_tokens=10, temperature=0, stop=[stop_s]).choices[0]
    pieces = [ch.choices[0].text for ch in c.completions.create(model="tiny", prompt="the god said unto the", max_tokens=10, temperature=0,
                                                                  stop=[stop_s], stream=True)]
    assert ans.finish_reason == "stop" and stop_s not in ans.text and "".join(pieces) == ans.text, (stop_s, ans.text, pieces)


def test_a_client_that_gives_up_cancels_a_non_streamed_request(server):
    m0 = metrics(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server + "/v1/completions", json={"prompt": "the god " * 30, "max_tokens": 400, "temperature": 0}, timeout=httpx.Timeout(10, read=0.3))
    for _ in range(100):
        m = metrics(server)
        if m["hqkv_engine_cancelled_total"] > m0["hqkv_engine_cancelled_total"] and m["hqkv_kv_pool_used_pages"] == 0: break
        time.sleep(0.1)
    assert m["hqkv_engine_cancelled_total"] == m0["hqkv_engine_cancelled_total"] + 1 and m["hqkv_kv_pool_used_pages"] == 0, (m0, m)


def _in_flight(base, out):
    "One stream and one non-streamed request, long enough to be running when the signal comes; what each client saw."
    def stream():
        lines = []
        with httpx.stream("POST", base + "/v1/completions", json={"prompt": "the god", "max_tokens": 450, "temperature": 0, "stream": True}, timeout=120) as r:
            for line in r.iter_lines():
                if line: lines.append(line)
                if len(lines) == 2: out["started"].set()
        out["stream"] = lines
    def plain():
        try: out["plain"] = httpx.post(base + "/v1/completions", json={"prompt": "the and", "max_tokens": 450, "temperature": 0}, timeout=120)
        except httpx.HTTPError as e: out["plain"] = e
    ts = [threading.Thread(target=f) for f in (stream, plain)]
    for t in ts: t.start()
    return ts


@pytest.mark.parametrize("grace", [120, 0])
def test_sigterm_drains_then_exits_0(tiny, grace):
    p, base = start(tiny, "--format", "bf16", "--budget", "2Ktok", "--context", "512", "--grace", str(grace))
    out = dict(started=threading.Event())
    try:
        ts = _in_flight(base, out)
        assert out["started"].wait(60)
        for _ in range(600):       # the plain request admitted too (or answered): one that arrives after the signal is refused
            m = metrics(base)
            if "plain" in out or m["hqkv_engine_running"] + m["hqkv_engine_waiting"] >= 2: break
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        for t in ts: t.join(120)
        assert p.wait(60) == 0
    finally:
        if p.poll() is None: p.kill()
    s, r = out["stream"], out["plain"]
    assert isinstance(r, httpx.Response), r                        # answered, not dropped
    assert s[-1] == "data: [DONE]", s[-3:]                          # and the stream closed properly
    last = json.loads(s[-2][6:])
    if grace:                                                       # time enough: both finish as if nothing happened
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("length", "stop"), r.text
        assert last["choices"][0]["finish_reason"] in ("length", "stop"), last
    else:                                                           # no grace: both told why they end
        err(r, 503, "shut down")
        assert "shut down" in last["error"]["message"], last


def test_fuzz_bodies_never_5xx_and_pages_come_back(server):
    """Hypothesis over request bodies (known fields with values of every JSON type, edge numbers, odd text, unknown fields),
    bounded in count and time: never a 5xx, never a hang, and after the batch the pool's pages are all back."""
    from hypothesis import example, given, settings, HealthCheck, strategies as st
    text = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(["", "\ud800", "the god " * 20, "<bos>", "<|im_end|>"])
    value = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() | text,
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=6)
    small = st.integers(-2, 6) | value
    fields = {"prompt": text | st.lists(st.integers(-5, 200), max_size=8) | value, "max_tokens": small, "max_completion_tokens": small,
              "temperature": st.floats(-1, 3) | value, "top_p": st.floats(-0.5, 1.5) | value, "seed": st.integers(-1, 2 ** 65) | value,
              "stream": st.booleans() | value, "stop": text | st.lists(text, max_size=5) | value, "n": small, "logprobs": small,
              "stream_options": st.none() | st.fixed_dictionaries({"include_usage": st.booleans() | value}) | value,
              "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", ""]) | value,
                                                          "content": text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2) | value}),
                                   max_size=3) | value,
              "frequency_penalty": small, "response_format": value, "zzz_unknown": value}
    body = st.dictionaries(st.sampled_from(sorted(fields)), st.none(), max_size=6).flatmap(
        lambda d: st.fixed_dictionaries({k: fields[k] for k in d}))
    seen = []

    @settings(max_examples=120, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(body, st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
    @example({"prompt": "the god", "max_tokens": 2, "temperature": None, "stop": None}, "/v1/completions")          # valid: the engine runs
    @example({"messages": [{"role": "user", "content": "the god"}], "max_tokens": 2, "n": None}, "/v1/chat/completions")
    def one(b, path):
        if isinstance(b.get("max_tokens"), int) and b["max_tokens"] > 6: b["max_tokens"] = 6   # bounded time per request
        r = httpx.post(server + path, content=json.dumps(b), headers={"Content-Type": "application/json"}, timeout=60)
        seen.append(r.status_code)
        assert r.status_code < 500, (path, b, r.status_code, r.text[:300])
    one()
    for _ in range(100):
        m = metrics(server)
        if m["hqkv_kv_pool_used_pages"] == 0 and m["hqkv_engine_running"] == 0: break
        time.sleep(0.1)
    assert m["hqkv_kv_pool_used_pages"] == 0 and m["hqkv_engine_running"] == 0, m
    assert len(seen) >= 100 and any(c == 200 for c in seen) and any(c == 400 for c in seen), sorted(set(seen))
