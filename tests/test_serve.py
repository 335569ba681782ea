"""`hqkv serve` as a user meets it: a real server process on 127.0.0.1 (a free port, started and stopped here) over a tiny
Llama, driven by the real `openai` client: completion, chat, streaming, a stop string, a 400, a 429, a client that
disconnects mid-stream (its pages come back), and /metrics parsed with prometheus_client's parser."""
import json, os, socket, subprocess, sys, time, threading
from pathlib import Path
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi"); pytest.importorskip("uvicorn")
import httpx
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s: s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def start(d, *args):
    "`hqkv serve` on a free port of 127.0.0.1; (process, base url) once /health answers."
    port = free_port()
    code = "import sys; from hqkv.cli import main; raise SystemExit(main(sys.argv[1:]))"
    log = open(Path(d).parent / f"serve-{port}.log", "w+")          # a file, not a pipe: a full pipe would block the server
    p = subprocess.Popen([sys.executable, "-c", code, "serve", "--model", str(d), "--port", str(port), "--key-profile", "off", *args],
                         stdout=log, stderr=subprocess.STDOUT, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200: break
        except httpx.HTTPError: pass
        if p.poll() is not None: log.seek(0); raise RuntimeError(log.read())
        time.sleep(0.2)
    else: p.kill(); raise RuntimeError("the server did not come up")
    return p, base

def stop(p):
    p.terminate()
    try: p.wait(20)
    except subprocess.TimeoutExpired: p.kill()

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from hqkv.models.load import write_tiny_model
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")

@pytest.fixture(scope="module")
def server(tiny):
    p, base = start(tiny, "--format", "bf16", "--budget", "2Ktok", "--context", "512", "--prefill-chunk", "64", "--max-waiting", "2")
    yield base, tiny
    stop(p)


def metrics(base) -> dict:
    return {s.name: s.value for f in text_string_to_metric_families(httpx.get(base + "/metrics").text) for s in f.samples if not s.labels}


def test_completion_chat_stream_and_stop(server):
    base, d = server
    c = openai.OpenAI(base_url=base + "/v1", api_key="none")
    assert [m.id for m in c.models.list().data] == ["tiny-llama"]
    r = c.completions.create(model="tiny-llama", prompt="the god said unto the", max_tokens=8, temperature=0)
    text = r.choices[0].text
    assert r.usage.prompt_tokens > 0 and r.choices[0].finish_reason in ("length", "stop")
    from hqkv.models.load import load_causal_lm
    from hqkv.testing import check_greedy, ref_topk, reference_greedy
    lm = load_causal_lm(d)
    prompt_ids = lm.tokenizer("the god said unto the")["input_ids"]
    want = reference_greedy(lm.model, prompt_ids, 8)
    got = lm.tokenizer(text, add_special_tokens=False)["input_ids"] + ([2] if r.choices[0].finish_reason == "stop" else [])
    check_greedy(got, want[:len(got)], ref_topk(lm.model, prompt_ids, want), what="served vs transformers")   # up to near-ties
    pieces = [ch.choices[0].text for ch in c.completions.create(model="tiny-llama", prompt="the god said unto the", max_tokens=8, temperature=0, stream=True)]
    assert "".join(pieces) == text and len(pieces) > 1
    chat = c.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "the god"}], max_tokens=4, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    words = text.split()
    if len(words) > 1:
        cut = c.completions.create(model="tiny-llama", prompt="the god said unto the", max_tokens=8, temperature=0, stop=[words[1]])
        assert cut.choices[0].text == text[:text.find(words[1])] and cut.choices[0].finish_reason == "stop"


def test_400_and_429(server):
    base, _ = server
    c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="the prompt of 600 tokens does not fit the context of 512 tokens"):
        c.completions.create(model="tiny-llama", prompt="the " * 600, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="exceeds the context of 512 tokens"):
        c.completions.create(model="tiny-llama", prompt="the " * 100, max_tokens=500)
    with pytest.raises(openai.BadRequestError, match="n=2 is not supported"):
        c.completions.create(model="tiny-llama", prompt="the", n=2)
    # three long streams against a door of two waiting: at least one is told to come back later
    results = []
    def one():
        try: results.append(c.completions.create(model="tiny-llama", prompt="the god " * 100, max_tokens=200, temperature=0).choices[0].finish_reason)
        except openai.RateLimitError: results.append(429)
    ts = [threading.Thread(target=one) for _ in range(12)]
    for t in ts: t.start()
    for t in ts: t.join()
    assert 429 in results and any(r != 429 for r in results), results
    m = metrics(base)
    assert m["hqkv_kv_pool_used_pages"] == 0


def test_multi_turn_chat_reuses_the_history(server):
    """A chat's second turn resends the first: its shared pages are reused (counted in /metrics), only the rest
    is computed, and the answer is the one a server without prefix reuse gives."""
    base, d = server
    c = openai.OpenAI(base_url=base + "/v1", api_key="none")
    msgs = [{"role": "user", "content": "the god said unto the " * 30}]            # 150 words: two full pages of history
    first = c.chat.completions.create(model="tiny-llama", messages=msgs, max_tokens=6, temperature=0).choices[0].message.content
    msgs += [{"role": "assistant", "content": first}, {"role": "user", "content": "and the god"}]
    m0 = metrics(base)
    second = c.chat.completions.create(model="tiny-llama", messages=msgs, max_tokens=6, temperature=0)
    m = metrics(base)
    reused = m["hqkv_engine_prefix_reused_tokens_total"] - m0["hqkv_engine_prefix_reused_tokens_total"]
    computed = m["hqkv_engine_prefill_tokens_total"] - m0["hqkv_engine_prefill_tokens_total"]
    assert reused >= 128 and computed == second.usage.prompt_tokens - reused, (reused, computed, second.usage)
    p, base2 = start(d, "--format", "bf16", "--budget", "2Ktok", "--context", "512", "--prefill-chunk", "64", "--no-prefix-reuse")
    try:
        c2 = openai.OpenAI(base_url=base2 + "/v1", api_key="none")
        c2.chat.completions.create(model="tiny-llama", messages=msgs[:1], max_tokens=6, temperature=0)
        again = c2.chat.completions.create(model="tiny-llama", messages=msgs, max_tokens=6, temperature=0)
        assert metrics(base2)["hqkv_engine_prefill_tokens_total"] >= again.usage.prompt_tokens   # every prompt token computed
    finally: stop(p)
    from hqkv.models.load import load_causal_lm                 # both: transformers' greedy answer up to its near-ties
    from hqkv.testing import check_reference_greedy
    lm = load_causal_lm(d)
    ids = lm.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    for what, ans in (("reused history", second), ("recomputed history", again)):
        toks = lm.tokenizer(ans.choices[0].message.content, add_special_tokens=False)["input_ids"]
        check_reference_greedy(lm.model, ids, toks + ([2] if ans.choices[0].finish_reason == "stop" else []), what=what)


def test_disconnect_returns_pages(server):
    base, _ = server
    with httpx.stream("POST", base + "/v1/completions", json={"prompt": "the god " * 60, "max_tokens": 300, "temperature": 0, "stream": True}, timeout=60) as r:
        for i, line in enumerate(r.iter_lines()):
            if i >= 3: break                                           # three events, then hang up
    for _ in range(100):
        m = metrics(base)
        if m["hqkv_kv_pool_used_pages"] == 0 and m["hqkv_engine_running"] == 0: break
        time.sleep(0.1)
    assert m["hqkv_kv_pool_used_pages"] == 0 and m["hqkv_engine_cancelled_total"] >= 1, m


def test_64_concurrent_with_disconnects(tiny):
    """64 concurrent streaming requests, 20% of them hung up on after a few tokens: every other one completes with exactly
    the text it gets alone (greedy), no 5xx, and every page comes back."""
    import random
    p, base = start(tiny, "--format", "hq-e8-2b", "--budget", "16Ktok", "--context", "512", "--prefill-chunk", "128", "--max-waiting", "64")
    try:
        rng = random.Random(0)
        words = "the and of to in that he shall unto for his a they be is him not them it with all thou thy was god".split()
        prompts = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 150))) for _ in range(64)]
        hang = set(rng.sample(range(64), 13))
        body = lambda i, stream: {"prompt": prompts[i], "max_tokens": 24, "temperature": 0, "stream": stream}
        alone = {i: httpx.post(base + "/v1/completions", json=body(i, False), timeout=120).json()["choices"][0]["text"] for i in range(64) if i not in hang}
        got, codes = {}, []
        def one(i):
            with httpx.stream("POST", base + "/v1/completions", json=body(i, True), timeout=300) as r:
                codes.append(r.status_code)
                text = []
                for n, line in enumerate(r.iter_lines()):
                    if i in hang and n >= 3: return                      # hang up mid-stream
                    if line.startswith("data: ") and line != "data: [DONE]":
                        text.append(json.loads(line[6:])["choices"][0]["text"])
                got[i] = "".join(text)
        ts = [threading.Thread(target=one, args=(i,)) for i in range(64)]
        for t in ts: t.start()
        for t in ts: t.join(300)
        assert all(c < 500 for c in codes) and len(codes) == 64, codes
        assert set(got) >= set(alone), sorted(set(alone) - set(got))
        from hqkv.engine import Engine, SamplingParams      # the same engine in this process, each prompt alone, keeping its top logits
        from hqkv.testing import RefTopK, check_greedy
        from hqkv.models.load import load_causal_lm
        eng = Engine(model=load_causal_lm(tiny), kv_format="hq-e8-2b", kv_pool_bytes="16Ktok", max_context=512, prefill_chunk=128, key_profile="off")
        ids = lambda text: eng.tokenizer(text, add_special_tokens=False)["input_ids"]
        for i in (i for i in alone if got[i] != alone[i]):     # where load changed the text: the engine's greedy tokens up to its near-ties
            ref = eng.generate(prompts[i], 24, SamplingParams(top_logits=8))
            want = ref.output_ids + ([2] if ref.finish_reason == "stop" else [])            # 2: the tiny model's </s>
            for what, text in (("alone", alone[i]), ("under load", got[i])):
                toks = ids(text); toks += [2] if len(toks) < 24 else []                     # fewer than max_tokens: it stopped
                check_greedy(toks, want[:len(toks)], RefTopK.of(ref.top_logits), what=f"request {i} {what}")
        for _ in range(100):
            m = metrics(base)
            if m["hqkv_kv_pool_used_pages"] == 0 and m["hqkv_engine_running"] == 0: break
            time.sleep(0.1)
        assert m["hqkv_kv_pool_used_pages"] == 0 and m["hqkv_kv_pool_reserved_pages"] == 0, m
    finally: stop(p)
