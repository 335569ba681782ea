"""The docs site: `docs/build.py` builds `_site/` offline; headless Chromium opens the home page, an API page
and a page with a committed plot; README.md is what nbs/index.ipynb renders to; the index lists every notebook."""
import functools, html, http.server, importlib.util, json, re, shutil, subprocess, sys, tempfile, threading
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE, NBS = ROOT / "_site", ROOT / "nbs"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed: apt-get install -y chromium "
                                    "(the Makefile's docs-test prerequisite installs it)")


def _load_build():
    spec = importlib.util.spec_from_file_location("hqkv_docs_build", ROOT / "docs" / "build.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m

build = _load_build()


@pytest.fixture(scope="module")
def site():
    "Build the site once for this module (as `make docs` does)."
    r = subprocess.run([sys.executable, str(ROOT / "docs" / "build.py"), "site"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, f"docs build failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    assert (SITE / "index.html").is_file()
    return SITE


@pytest.fixture(scope="module")
def server(site):
    "The built site over http on 127.0.0.1 (a random free port)."
    handler = functools.partial(type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None}),
                                directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True); t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown(); httpd.server_close()


def chromium(url, *extra, timeout=90):
    "Headless Chromium on `url` with remote hosts unreachable; returns its stdout (the DOM with --dump-dom)."
    with tempfile.TemporaryDirectory(prefix="hqkv-chromium-") as prof:
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-dev-shm-usage", f"--user-data-dir={prof}",
               "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",   # viewing must work offline
               *extra, url]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"chromium failed ({r.returncode}): {r.stderr[-2000:]}"
    return r.stdout


def _png_size(p: Path):
    b = p.read_bytes()
    assert b[:8] == b"\x89PNG\r\n\x1a\n", f"{p} is not a PNG"
    return int.from_bytes(b[16:20], "big"), int.from_bytes(b[20:24], "big")


def _directives(src: str) -> dict:
    d = {}
    for line in src.splitlines():
        m = re.match(r"^\s*#\s*\|\s*([\w-]+)\s*(?::\s*(.*?))?\s*$", line)
        if m: d[m.group(1)] = (m.group(2) or "").strip().lower()
        elif line.strip(): break
    return d


def shown_png_outputs(nb_path: Path) -> int:
    "PNG outputs of a notebook's cells that the docs show (not hidden, not exported, output kept)."
    n = 0
    for c in json.loads(nb_path.read_text(encoding="utf-8"))["cells"]:
        if c["cell_type"] != "code": continue
        d = _directives("".join(c["source"]))
        if d.keys() & {"hide", "export", "exporti", "exports"} or d.get("include") == "false" or d.get("output") == "false": continue
        n += sum("image/png" in o.get("data", {}) for o in c.get("outputs", []))
    return n


# ---------------------------------------------------------------- the built site (no browser needed)
def test_one_page_per_notebook(site):
    nbs = build.doc_notebooks(NBS)
    assert nbs[0].name == "index.ipynb" and not any(p.name.startswith("_") for p in nbs)
    for p in nbs:
        page = site / ("index.html" if p.name == "index.ipynb" else build.page_name(p.name) + ".html")
        assert page.is_file(), f"{p.name} has no page {page.name}"
    home = (site / "index.html").read_text(encoding="utf-8")
    for p in nbs[1:]: assert f'href="{build.page_name(p.name)}.html"' in home, f"nav lacks {p.name}"


_re_remote_attr = re.compile(r"<(script|link|img|iframe|source|video|audio|embed)\b[^>]*?\b(src|href)\s*=\s*[\"']?(https?:)?//", re.I)
_re_remote_css = re.compile(r"(url\(\s*[\"']?(https?:)?//|@import\s+[\"'](https?:)?//)", re.I)

def test_nothing_fetched_from_the_network(site):
    "No page or stylesheet loads a remote resource (fonts, scripts, MathJax, RequireJS, widgets)."
    bad = []
    for f in site.rglob("*"):
        if f.suffix == ".html":
            t = f.read_text(encoding="utf-8", errors="replace")
            bad += [f"{f.relative_to(site)}: {m.group(0)[:120]}" for m in _re_remote_attr.finditer(t)]
            bad += [f"{f.relative_to(site)}: {m.group(0)}" for m in _re_remote_css.finditer(t)]
        elif f.suffix == ".css":
            t = f.read_text(encoding="utf-8", errors="replace")
            bad += [f"{f.relative_to(site)}: {m.group(0)}" for m in _re_remote_css.finditer(t)]
    assert not bad, "remote resources:\n" + "\n".join(bad[:20])
    assert (site / "assets" / "mathjax" / "MathJax.js").is_file()


def test_readme_is_index_rendered(site):
    "README.md is what `python docs/build.py readme` makes of nbs/index.ipynb (regenerate it after editing)."
    want = build.readme_text(json.loads((ROOT / "_proc" / "index.ipynb").read_text(encoding="utf-8")))
    assert (ROOT / "README.md").read_bytes().decode("utf-8") == want, \
        "README.md is stale: run `.venv/bin/python docs/build.py readme` and commit it"


def test_index_lists_every_notebook():
    "The index's table has a row per numbered notebook with its module; rows marked planned do not exist yet."
    src = "\n".join("".join(c["source"]) for c in json.loads((NBS / "index.ipynb").read_text(encoding="utf-8"))["cells"]
                    if c["cell_type"] == "markdown")
    rows = {m.group(1): line for line in src.splitlines() if (m := re.match(r"^\|\s*`([^`]+)`\s*\|", line))}
    problems = []
    for p in build.doc_notebooks(NBS)[1:]:
        row = rows.get(p.stem)
        if row is None: problems.append(f"{p.name} is not in the index's notebook table"); continue
        if "planned" in row: problems.append(f"{p.name} exists but its row says planned")
        cells = json.loads(p.read_text(encoding="utf-8"))["cells"]
        exp = next((m.group(1) for c in cells if c["cell_type"] == "code"
                    if (m := re.search(r"^\s*#\|\s*default_exp\s+(\S+)", "".join(c["source"]), re.M))), None)
        if exp:
            mod = "hqkv." + re.sub(r"\.__init__$", "", exp)
            if f"`{mod}`" not in row: problems.append(f"{p.name}: its row should name `{mod}`")
    assert not problems, "nbs/index.ipynb is out of date:\n" + "\n".join(problems)


# ---------------------------------------------------------------- in the browser
@needs_chromium
def test_home_page_renders(server):
    dom = chromium(f"{server}/index.html", "--dump-dom")
    assert re.search(r"<title>\s*hqkv\s*</title>", dom), "page title"
    assert re.search(r"<h1[^>]*>\s*hqkv", dom), "the index notebook's H1"
    text = html.unescape(re.sub(r"<[^>]+>", "", dom))
    assert "make demo" in text and "make test" in text, "the two commands"
    assert 'href="codec.base.html"' in dom, "nav link to the codec base notebook"
    shot = SITE / "screenshot-home.png"
    shot.unlink(missing_ok=True)
    chromium(f"{server}/index.html", f"--screenshot={shot}", "--window-size=1280,900", "--hide-scrollbars")
    assert _png_size(shot) == (1280, 900)
    import matplotlib.image as mpimg
    assert mpimg.imread(str(shot)).std() > 0.01, "the screenshot is blank"


@needs_chromium
def test_api_page_renders(server):
    "The codec base page carries the API reference that show_doc rendered for `Codec`, `get_codec`, `check_codec`."
    dom = chromium(f"{server}/codec.base.html", "--dump-dom")
    assert re.search(r"<title>\s*Codec base and registry", dom)
    for name in ("Codec", "get_codec", "check_codec"):
        assert re.search(rf"<h3[^>]*>\s*{name}\b", dom), f"no API entry (show_doc heading) for {name}"
    text = html.unescape(re.sub(r"<[^>]+>", "", dom))
    assert re.search(r"def get_codec\(\s*name:\s*str", text), "get_codec's signature"
    assert re.search(r"def check_codec\(", text), "check_codec's signature"


@needs_chromium
def test_plot_renders(server):
    "Every committed PNG plot of a notebook shows up as an image on its page (00_sizing's first, if it has any)."
    nbs = [p for p in build.doc_notebooks(NBS) if shown_png_outputs(p)]
    if not nbs: pytest.skip("no notebook has a committed PNG output yet")
    p = next((q for q in nbs if q.name == "00_sizing.ipynb"), nbs[0])
    url = f"{server}/{'index' if p.name == 'index.ipynb' else build.page_name(p.name)}.html"
    dom = chromium(url, "--dump-dom")
    imgs = re.findall(r"<img\b[^>]*\bsrc=\"data:image/png;base64,[A-Za-z0-9+/=]{200,}", dom)
    assert len(imgs) == shown_png_outputs(p), f"{p.name}: {len(imgs)} PNG images on the page, {shown_png_outputs(p)} in the notebook"
    shot = SITE / f"screenshot-{build.page_name(p.name)}.png"
    chromium(url, f"--screenshot={shot}", "--window-size=1280,900", "--hide-scrollbars")
    assert _png_size(shot) == (1280, 900)
