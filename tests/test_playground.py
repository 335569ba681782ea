"""The Playground (`hqkv serve`'s `GET /`) in a real browser: a server on SmolLM2-135M (127.0.0.1, a free port, started
and stopped here) and headless Chromium (Debian's package, as the docs test uses) driven over the DevTools protocol
through a websocket (`websocket-client`, nothing else installed). The page shows a 400 and a 429 as the server's messages,
streams an answer, finds its own request's pages in the Monitor while it streams, and the pool's used pages rise and fall back.
A screenshot taken while the second answer streams is saved with the test's results (its tmp_path); `make screenshot` writes
it to nbs/results/playground.png, the README's (HQKV_PLAYGROUND_SHOT names the file), so a test run leaves the tree as it was."""
import base64, json, os, shutil, socket, subprocess, sys, tempfile, threading, time
from contextlib import contextmanager
from pathlib import Path
import pytest

pytest.importorskip("fastapi"); pytest.importorskip("uvicorn")
websocket = pytest.importorskip("websocket", reason="websocket-client (the dev extra) drives Chromium's DevTools protocol")
import httpx

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed: apt-get install -y chromium "
                                "(the Makefile's `chromium` target, a prerequisite of `make test`, installs it)")


def free_port() -> int:
    with socket.socket() as s: s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


@contextmanager
def serve(tmp: Path, *args):
    "`hqkv serve` on a free port of 127.0.0.1 (one torch thread: the machine's cores are shared); its base url once /health answers."
    port, log = free_port(), open(tmp / "serve.log", "w+")
    code = "import sys; from hqkv.cli import main; raise SystemExit(main(sys.argv[1:]))"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-c", code, "serve", "--port", str(port), *args], stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(900):
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200: break
            except httpx.HTTPError: pass
            if p.poll() is not None: log.seek(0); raise RuntimeError(log.read())
            time.sleep(0.1)
        else: raise RuntimeError("the server did not come up")
        yield base
    finally:
        p.terminate()
        try: p.wait(20)
        except subprocess.TimeoutExpired: p.kill(); p.wait()
        log.close()


class DevTools:
    "One page of Chromium over the DevTools protocol: `call` a method, evaluate JavaScript, wait for a condition."
    def __init__(self, ws_url: str):
        self.ws, self._id = websocket.create_connection(ws_url, timeout=60, suppress_origin=True), 0

    def call(self, method: str, **params) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:                                            # no domain is enabled: only answers come back
            m = json.loads(self.ws.recv())
            if m.get("id") == self._id:
                if "error" in m: raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]

    def js(self, expr: str):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r: raise RuntimeError(f"{expr[:80]}...: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr: str, timeout: float, what: str, every: float = 0.1):
        t0, v = time.monotonic(), None
        while time.monotonic() - t0 < timeout:
            if v := self.js(expr): return v
            time.sleep(every)
        raise AssertionError(f"{what}: not within {timeout} s (last: {v!r})")

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        return path


@contextmanager
def chromium(url: str, width: int = 1280, height: int = 800):
    "Headless Chromium on `url` (remote hosts unreachable, a fresh profile), driven through `DevTools`."
    prof = tempfile.mkdtemp(prefix="hqkv-chromium-")
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
           f"--user-data-dir={prof}", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
           f"--window-size={width},{height}", "--hide-scrollbars", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", url]
    log = open(Path(prof) / "chromium.log", "w+")
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    dt = None
    try:
        active = Path(prof) / "DevToolsActivePort"                # Chromium writes the port it picked here
        for _ in range(300):
            if active.is_file() and active.read_text().strip(): break
            if p.poll() is not None: log.seek(0); raise RuntimeError(f"chromium exited {p.returncode}: {log.read()[-2000:]}")
            time.sleep(0.1)
        else: raise RuntimeError("chromium did not open its DevTools port")
        port = int(active.read_text().split()[0])
        page = next(t for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json() if t["type"] == "page")
        dt = DevTools(page["webSocketDebuggerUrl"])
        dt.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        yield dt
    finally:
        if dt is not None: dt.ws.close()
        p.terminate()
        try: p.wait(10)
        except subprocess.TimeoutExpired: p.kill(); p.wait()
        log.close(); shutil.rmtree(prof, ignore_errors=True)


LOOK = """(() => { const s = window.hqkvPlayground, a = document.querySelectorAll('#log .msg.assistant'), e = document.getElementById('error');
  const last = a.length ? a[a.length - 1] : null;
  return {busy: s.busy, answers: s.answers, n: a.length, text: last ? last.querySelector('.text').textContent : null,
          used: Number(document.getElementById('gauges').dataset.used), mine: s.mine, mine_max: s.mineMaxUsed,
          error: e.hidden ? null : e.textContent}; })()"""

def ask(dt: DevTools, prompt: str, max_tokens, temperature=0):
    "Type into the page's controls and press Send, as a user does."
    dt.js(f"""document.getElementById('prompt').value = {json.dumps(prompt)};
              document.getElementById('max-tokens').value = {json.dumps(str(max_tokens))};
              document.getElementById('temperature').value = {json.dumps(str(temperature))};
              document.getElementById('send').click(); true""")

@contextmanager
def busy_server(base: str):
    "One request running and one waiting (a server of one lane and a queue of one): the next is refused with 429; both hang up after."
    stop, started = threading.Event(), threading.Event()
    def one():
        body = {"prompt": "In the beginning God created the heaven and the earth. " * 4, "max_tokens": 300, "temperature": 0, "stream": True}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "): started.set()
                if stop.is_set(): return                          # hang up: the server cancels it and frees its pages
    ts = [threading.Thread(target=one, daemon=True) for _ in range(2)]
    ts[0].start()
    assert started.wait(60), "the first request did not start"
    ts[1].start()
    for _ in range(200):
        if "hqkv_engine_waiting 1.0" in httpx.get(base + "/metrics").text: break
        time.sleep(0.05)
    else: raise AssertionError("the second request is not waiting")
    try: yield
    finally:
        stop.set()
        for t in ts: t.join(60)

def watch(dt: DevTools, answers: int, timeout: float, shot: Path|None = None) -> list:
    "What the page shows every 0.1 s until its answer count reaches `answers`; a screenshot once the answer is well under way."
    seen, t0 = [], time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = dt.js(LOOK); seen.append(v)
        if v["error"]: raise AssertionError(f"the page shows an error: {v['error']}")
        if shot is not None and v["busy"] and v["mine_max"] and len(v["text"] or "") > 60:
            dt.screenshot(shot); shot = None
        if v["answers"] >= answers and not v["busy"]: return seen
        time.sleep(0.1)
    raise AssertionError(f"no answer within {timeout} s: {seen[-1] if seen else None}")


@pytest.mark.model
def test_playground_in_chromium(tmp_path):
    SHOT = Path(os.environ.get("HQKV_PLAYGROUND_SHOT") or tmp_path / "playground.png")
    from hqkv.models.load import fetch_model, ModelUnavailable
    try: fetch_model("smollm2-135m")
    except ModelUnavailable as e: pytest.skip(str(e))
    t_start = time.monotonic()
    with serve(tmp_path, "--model", "smollm2-135m", "--format", "hq-e8-2b", "--budget", "2Ktok", "--context", "1024",
               "--key-profile", "off", "--max-batch", "1", "--max-waiting", "1") as base, chromium(base + "/") as dt:
        dt.wait("(g => document.readyState === 'complete' && g && g.dataset.total)(document.getElementById('gauges'))", 30, "the Monitor's first poll")
        assert dt.js("document.title") == "hqkv Playground"
        dt.wait("document.getElementById('model').textContent === 'model smollm2-135m'", 10, "the model's name")
        pool = httpx.get(base + "/v1/hqkv/pool").json()
        assert dt.js("document.getElementById('kv-format').textContent") == "format hq-e8-2b"
        assert dt.js("Number(document.getElementById('gauges').dataset.total)") == pool["total"] == 32
        assert dt.js("document.getElementById('plan').textContent") == pool["plan"]
        assert dt.js("document.querySelectorAll('#bitplan .cell').length") == 2 * 30          # K and V of 30 layers

        # a request that can never fit: the server's 400, readable on the page, and nothing left streaming
        ask(dt, "Hello", 5000)
        err = dt.wait("(e => !e.hidden && e.textContent)(document.getElementById('error'))", 20, "the error message")
        assert err.startswith("400 refused: ") and "exceeds the context of 1024 tokens" in err, err
        assert dt.js("window.hqkvPlayground.busy") is False and dt.js("document.querySelectorAll('#log .msg.assistant').length") == 0

        # a full queue: the server's 429 with its Retry-After, readable on the page
        with busy_server(base):
            ask(dt, "Hello", 8)
            err = dt.wait("(e => !e.hidden && e.textContent.startsWith('429') && e.textContent)(document.getElementById('error'))", 20, "the 429 message")
        assert "the queue is full" in err and err.endswith("(retry after 1 s)"), err
        dt.wait("Number(document.getElementById('gauges').dataset.used) === 0", 20, "the hung-up requests' pages back")

        # a chat answer streams; the Monitor finds this request's pages while it runs, then every page comes back
        ask(dt, "Explain in a few sentences what a KV cache is and why a paged one helps a server with many users.", 40)
        seen = watch(dt, 1, 60)
        texts = [v["text"] for v in seen if v["busy"] and v["text"]]
        assert len(set(texts)) >= 2, "the answer did not arrive in pieces"
        assert seen[-1]["text"] and seen[-1]["text"].startswith(texts[0])
        assert max(v["used"] for v in seen) >= 1 and seen[-1]["mine_max"] >= 1, "the Monitor never showed the request's pages"
        dt.wait("Number(document.getElementById('gauges').dataset.used) === 0", 10, "the used pages back to 0")

        # the second turn: screenshot while it streams (the first turn's rise and fall on the left of the chart)
        SHOT.unlink(missing_ok=True)
        ask(dt, "Now say it in one sentence for a child.", 40)
        seen2 = watch(dt, 2, 60, shot=SHOT)
        dt.wait("Number(document.getElementById('gauges').dataset.used) === 0", 10, "the used pages back to 0")
        hist = dt.js("window.hqkvPlayground.history.map(r => r.used)")
        rises = sum(1 for a, b in zip(hist, hist[1:]) if a == 0 and b > 0)
        assert rises >= 3 and hist[-1] == 0, hist                  # the busy server's, then two answers: used rose from 0 and fell back
        assert max(v["mine_max"] for v in seen2) >= 1

        # completion mode: the prompt as it is, to v1/completions
        dt.js("document.getElementById('mode').value = 'completion'; true")
        ask(dt, "In the beginning God created", 8)
        seen3 = watch(dt, 3, 60)
        assert seen3[-1]["text"] and seen3[-1]["n"] == 3
    assert SHOT.is_file(), "no screenshot was taken while the second answer streamed"
    b = SHOT.read_bytes()
    assert b[:8] == b"\x89PNG\r\n\x1a\n" and (int.from_bytes(b[16:20], "big"), int.from_bytes(b[20:24], "big")) == (1280, 800)
    print(f"test_playground_in_chromium: {time.monotonic() - t_start:.1f} s")
