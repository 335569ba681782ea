#!/usr/bin/env python
"""Build the docs site (`_site/`) and README.md from the notebooks, offline.

    python docs/build.py          # the site: nbs/ -> _proc/ (nbdev) -> _docs/ (staged) -> _site/ (mkdocs)
    python docs/build.py readme   # README.md from nbs/index.ipynb (nbdev's readme_nb)
    python docs/build.py all      # both

Pipeline:
1. nbdev's doc processors (what `nbdev-proc-nbs` runs) turn every notebook into `_proc/<name>.ipynb`:
   directives (`#| hide`, `#| export`, ...) take effect and `show_doc` cells are added after exported
   names and executed (the API reference). Not the `nbdev-proc-nbs` command itself: it first runs
   `_ensure_quarto`, which downloads Quarto when it is missing (no network, and Quarto is not needed);
   see `proc` for the one other difference (which cells are re-executed).
2. `stage` turns the processed notebooks into plain notebooks for mkdocs-jupyter in `_docs/src/`:
   the front matter becomes the page's H1 and summary, Quarto-only cells and directive lines go,
   `#| echo: false` hides a cell's input, `#| output: false` its outputs; links to the docs host become
   relative; widget state is dropped (it would pull the widget manager from a CDN).
3. mkdocs-material + mkdocs-jupyter render `_docs/src/` to `_site/` with a configuration generated from
   `docs/mkdocs.yml` plus a nav derived from the notebook names (numbered notebooks; names starting
   with `_` are scratch and skipped). Nothing is fetched at build or view time: no web fonts,
   no RequireJS, MathJax served from `_site/assets/mathjax` (the `jupyter-server-mathjax` package).

The notebooks' committed outputs (plots, tables) are rendered as they are; nothing is re-executed
except what `show_doc` needs (exported cells and imports).
"""
from __future__ import annotations
import copy, json, os, re, shutil, subprocess, sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NBS = ROOT / "nbs"
PROC = ROOT / "_proc"
STAGE = ROOT / "_docs"
SITE = ROOT / "_site"

# Nav sections by the notebook number's first digit (DESIGN.md section 2's layers).
SECTIONS = {"0": "Foundations", "1": "Codecs, models, key profiles and bit plans", "2": "Pool", "3": "Attention and kernels",
            "4": "Model and engine", "5": "Quality and measurements", "6": "Monitor", "7": "Integrations (transformers, vLLM)"}
ASSET_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".svg", ".csv", ".json", ".txt"}
_re_num = re.compile(r"^(\d+)[a-z]?_")
_re_directive = re.compile(r"^\s*#\s*\|\s*([\w-]+)\s*(?::\s*(.*?))?\s*$")


def doc_notebooks(nbs: Path = NBS) -> list[Path]:
    "The notebooks that are pages: index.ipynb and the numbered ones, in nav order (no `_` scratch ones)."
    nbs_ = sorted(p for p in nbs.glob("*.ipynb") if not p.name.startswith(("_", ".")))
    index = [p for p in nbs_ if p.name == "index.ipynb"]
    numbered = [p for p in nbs_ if _re_num.match(p.name)]
    return index + numbered


def _section(nb_name: str, digit: str) -> str:
    "The nav section of a numbered notebook; a number with no named section is an error, not a 'Part N'."
    if digit not in SECTIONS: raise SystemExit(f"docs: {nb_name}: no nav section for notebooks numbered {digit}x; name one in SECTIONS ({sorted(SECTIONS)})")
    return SECTIONS[digit]


def page_name(nb_name: str) -> str:
    "Page stem as nbdev names it (the numeric prefix dropped): `10_codec.base.ipynb` -> `codec.base`."
    stem = Path(nb_name).stem
    return _re_num.sub("", stem)


# ---------------------------------------------------------------- 1. nbdev processing
_TST_FLAGS: set = set()   # nbdev's tst_flags (pyproject): cells nbdev-test skips are not run for the docs either

def _do_eval_docs(cell):
    "Which cells `show_doc` needs run: exported/`exec_doc` cells, `show_doc` calls and cells of imports only."
    import ast
    from nbdev.processors import cell_lang, _show_docs
    if cell.cell_type != "code" or cell_lang(cell) != "python" or not cell.source: return
    d = cell.directives_
    if d.get("eval", "").lower() == "false": return
    trees = cell.parsed_()
    if not trees: return
    if d.keys() & {"export", "exports", "exporti", "exec_doc"}: return True
    if d.keys() & _TST_FLAGS: return
    if all(isinstance(t, (ast.Import, ast.ImportFrom)) for t in trees): return True
    if _show_docs(trees): return True


def proc_one(src: Path, dst: Path):
    "Process one notebook with nbdev's doc processors (in this process: run it in a fresh one)."
    import nbdev.processors as P
    from fastcore.nbio import read_nb, write_nb
    from nbdev.config import get_config
    flags = get_config(str(ROOT)).get("tst_flags", "")
    _TST_FLAGS.update(flags.split() if isinstance(flags, str) else flags)
    P._do_eval = _do_eval_docs
    os.environ["IN_TEST"] = "1"
    nb = read_nb(src)
    P.FilterDefaults()(nb)
    dst.parent.mkdir(parents=True, exist_ok=True)
    write_nb(nb, dst)


def _proc_child(s: Path, d: Path, log: Path):
    "A forked child: process one notebook, its output to `log`; exits with 0 or 1 (never returns)."
    code = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1); os.dup2(fd, 2)
        import traceback, warnings
        warnings.simplefilter("ignore")
        try: proc_one(s, d); code = 0
        except BaseException: traceback.print_exc()
        sys.stdout.flush(); sys.stderr.flush()
    finally: os._exit(code)


def _proc_forked(todo: list, n_workers: int) -> list:
    """`todo`'s notebooks, each in a child forked from this process after the imports every notebook needs (torch,
    hqkv, nbdev): a fresh state per notebook, as a fresh process gives, without paying those imports once per
    notebook (about 2 s of CPU each, most of the processing). [(source, log text)] of the failures."""
    import tempfile
    import torch, hqkv, nbdev.processors, nbdev.showdoc, fastcore.nbio  # noqa: F401
    todo, running, failed = list(todo), {}, []
    with tempfile.TemporaryDirectory(prefix="hqkv-docs-") as tmp:
        while todo or running:
            while todo and len(running) < max(1, n_workers):
                s, d = todo.pop(0); log = Path(tmp) / f"{s.stem}.log"
                sys.stdout.flush(); sys.stderr.flush()
                pid = os.fork()
                if pid == 0: _proc_child(s, d, log)
                running[pid] = (s, log)
            pid, status = os.wait()
            if pid not in running: continue
            s, log = running.pop(pid)
            if os.waitstatus_to_exitcode(status):
                failed.append((s, log.read_text(errors="replace") if log.exists() else ""))
    return failed


def proc(notebooks: list[Path], n_workers: int = 2, force: bool = False) -> Path:
    """nbdev's processing of every doc notebook into `_proc/` (directives, show_doc), one fresh process each
    (forked after the common imports where the OS can fork).

    Like `nbdev-proc-nbs` (which we cannot call: it downloads Quarto when it is missing), with one
    deliberate difference: nbdev re-executes any cell that contains an import, so a cell such as
    `import matplotlib.pyplot as plt; plt.plot(x)` runs out of context (and fails, or replaces the
    committed plot). Here only what `show_doc` needs is run (exported cells, `show_doc` calls,
    cells of imports only); every other output stays as committed."""
    from concurrent.futures import ThreadPoolExecutor
    PROC.mkdir(exist_ok=True)
    stamp = max(Path(__file__).stat().st_mtime, (ROOT / "pyproject.toml").stat().st_mtime)
    todo = [(s, PROC / s.name) for s in notebooks]
    todo = [(s, d) for s, d in todo if force or not d.exists() or d.stat().st_mtime < max(s.stat().st_mtime, stamp)]
    if hasattr(os, "fork"): failed = _proc_forked(todo, n_workers)
    else:
        def run(sd):
            s, d = sd
            r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "_proc-one", str(s), str(d)], cwd=ROOT,
                               capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
            return s, r
        with ThreadPoolExecutor(max(1, n_workers)) as ex:
            failed = [(s, r.stderr) for s, r in ex.map(run, todo) if r.returncode]
    for s, err in failed: print(f"docs: processing {s.relative_to(ROOT)} failed:\n{err[-3000:]}", file=sys.stderr)
    if failed: raise SystemExit(f"docs: nbdev processing failed for {', '.join(s.name for s, _ in failed)}")
    return PROC


# ---------------------------------------------------------------- 2. staging
def _src(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def split_directives(src: str) -> tuple[dict, str]:
    "Leading `#| key: value` lines of a code cell -> (dict, remaining source)."
    lines, d = src.splitlines(), {}
    i = 0
    while i < len(lines):
        m = _re_directive.match(lines[i])
        if m: d[m.group(1)] = (m.group(2) or "").strip()
        elif lines[i].strip(): break
        i += 1
    return d, "\n".join(lines[i:]).strip("\n")


def _front_matter(cell) -> dict | None:
    s = _src(cell).strip()
    if cell.get("cell_type") != "raw" or not s.startswith("---"): return None
    body = s.strip("-\n ")
    try: fm = yaml.safe_load(body) or {}
    except yaml.YAMLError as e: raise ValueError(f"unreadable front matter {s[:200]!r}: {e}") from e
    return fm if isinstance(fm, dict) else None


def _md_cell(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


_re_attr_link = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)\{[^}]*\}")

def _relink(text: str, base: str) -> str:
    "Links into our own docs host made relative (the site is browsed offline); Pandoc link attributes dropped."
    if base: text = text.replace(base, "")
    return _re_attr_link.sub(lambda m: f'<a class="hqkv-source" href="{m.group(2)}">{m.group(1)}</a>', text)


def stage_nb(nb: dict, base_url: str = "") -> tuple[dict, dict]:
    "A processed (nbdev) notebook -> (plain notebook for mkdocs-jupyter, front matter)."
    nb = copy.deepcopy(nb)
    fm, cells = {}, []
    for i, cell in enumerate(nb.get("cells", [])):
        ct = cell.get("cell_type")
        if "source" not in cell: continue                     # removed by nbdev (hide/export)
        if i == 0 and (f := _front_matter(cell)) is not None:
            fm = f
            head = f"# {fm.get('title', '')}".rstrip()
            if fm.get("description"): head += f"\n\n> {fm['description']}"
            cells.append(_md_cell(head)); continue
        src = _src(cell)
        if ct == "markdown":
            s = src.strip()
            if s.startswith("<!-- WARNING: THIS FILE WAS AUTOGENERATED"): continue
            if re.fullmatch(r":::+(\s*\{[^}]*\})?", s): continue   # Quarto fenced-div markers
            cell["source"] = _relink(src, base_url)
        elif ct == "code":
            d, body = split_directives(src)
            if d.get("include", "").lower() == "false": continue
            if d.get("output", "").lower() == "false": cell["outputs"] = []
            tags = cell.setdefault("metadata", {}).setdefault("tags", [])
            if d.get("echo", "").lower() == "false" and "hide-input" not in tags: tags.append("hide-input")
            if not tags: cell["metadata"].pop("tags")
            cell["source"] = body
            for o in cell.get("outputs", []):
                md = o.get("data", {}).get("text/markdown")
                if md is not None:
                    o["data"]["text/markdown"] = _relink("".join(md) if isinstance(md, list) else md, base_url)
            if not body and not cell.get("outputs"): continue
            cell["metadata"].pop("execution", None)
        cells.append(cell)
    nb["cells"] = cells
    nb.setdefault("metadata", {}).pop("widgets", None)        # a widget state would load the manager from a CDN
    return nb, fm


def _base_url() -> str:
    from nbdev.config import get_config
    cfg = get_config(str(ROOT))
    host, base = str(cfg.get("doc_host", "")).rstrip("/"), str(cfg.get("doc_baseurl", "")).strip("/")
    return f"{host}/{base}/" if host and base else (f"{host}/" if host else "")


def stage(notebooks: list[Path], proc_dir: Path = PROC, out: Path = STAGE) -> list[dict]:
    "Stage `_proc/` into `out/src` for mkdocs; returns the pages [{file, title, section}] in nav order."
    src_dir = out / "src"
    if out.exists(): shutil.rmtree(out)
    src_dir.mkdir(parents=True)
    base, pages = _base_url(), []
    for nbp in notebooks:
        pp = proc_dir / nbp.name
        if not pp.exists(): raise FileNotFoundError(f"{pp} missing: nbdev processing did not produce it")
        nb, fm = stage_nb(json.loads(pp.read_text(encoding="utf-8")), base)
        name = "index" if nbp.name == "index.ipynb" else page_name(nbp.name)
        (src_dir / f"{name}.ipynb").write_text(json.dumps(nb, indent=1, ensure_ascii=False), encoding="utf-8")
        m = _re_num.match(nbp.name)
        pages.append(dict(file=f"{name}.ipynb", title=fm.get("title") or name,
                          section=None if m is None else _section(nbp.name, m.group(1)[0])))
    for f in NBS.rglob("*"):                                    # images/tables the notebooks link to
        rel = f.relative_to(NBS)
        if f.is_file() and f.suffix.lower() in ASSET_SUFFIXES and not any(p.startswith((".", "_")) for p in rel.parts):
            (src_dir / rel).parent.mkdir(parents=True, exist_ok=True); shutil.copy2(f, src_dir / rel)
    shutil.copytree(DOCS / "assets", src_dir / "assets", dirs_exist_ok=True)
    try: import jupyter_server_mathjax
    except ImportError as e:
        raise SystemExit("docs: the `jupyter-server-mathjax` package is missing (it serves MathJax offline); "
                         "install the docs extra: pip install -e '.[docs]'") from e
    shutil.copytree(Path(jupyter_server_mathjax.__file__).parent / "static", src_dir / "assets" / "mathjax")
    return pages


def nav(pages: list[dict]) -> list:
    "mkdocs nav: Home, then one section per layer in notebook order."
    out, cur = [], None
    for p in pages:
        if p["section"] is None: out.append({"Home" if p["file"] == "index.ipynb" else p["title"]: p["file"]}); continue
        if cur is None or cur[0] != p["section"]:
            cur = (p["section"], []); out.append({cur[0]: cur[1]})
        cur[1].append({p["title"]: p["file"]})
    return out


def mkdocs_config(pages: list[dict], out: Path = STAGE, site: Path = SITE) -> Path:
    "Write `out/mkdocs.yml`: docs/mkdocs.yml + nav + paths."
    cfg = yaml.safe_load((DOCS / "mkdocs.yml").read_text(encoding="utf-8"))
    cfg.update(docs_dir=str(out / "src"), site_dir=str(site), nav=nav(pages))
    p = out / "mkdocs.yml"
    p.write_text(yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return p


def build_site(n_workers: int = 2) -> Path:
    "The whole site pipeline; returns `_site/`."
    for m in ("mkdocs", "material", "mkdocs_jupyter"):
        try: __import__(m)
        except ImportError as e: raise SystemExit(f"docs: {m} is missing; install the docs extra: pip install -e '.[docs]'") from e
    notebooks = doc_notebooks(NBS)                              # one list: other notebooks may appear meanwhile
    proc(notebooks, n_workers)
    pages = stage(notebooks)
    cfgp = mkdocs_config(pages)
    if SITE.exists(): shutil.rmtree(SITE)
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(cfgp)], cwd=ROOT,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"})
    if r.returncode: raise SystemExit(f"docs: mkdocs build failed (exit {r.returncode})")
    print(f"docs: {len(pages)} pages -> {SITE}/index.html")
    return SITE


# ---------------------------------------------------------------- README.md from index.ipynb
def _out_text(o) -> str | None:
    "Markdown for one output: markdown as is, text in a fence, images refused (README stays text-only)."
    if o.get("output_type") == "stream": return "```\n" + "".join(o.get("text", "")).rstrip("\n") + "\n```"
    if o.get("output_type") == "error": raise ValueError("index.ipynb has an error output; run it cleanly first")
    data = o.get("data", {})
    j = lambda v: "".join(v) if isinstance(v, list) else v
    if "text/markdown" in data: return j(data["text/markdown"]).strip()
    if "text/plain" in data: return "```\n" + j(data["text/plain"]).rstrip("\n") + "\n```"
    return None


_re_md_image = re.compile(r"(!\[[^\]]*\]\()(?![a-z]+:|/|#)([^)\s]+)")

def _readme_images(md: str) -> str:
    "Images the index notebook shows from nbs/ (`results/x.png`) as README.md, at the repository root, finds them (`nbs/results/x.png`)."
    return _re_md_image.sub(lambda m: m.group(1) + ("nbs/" if (NBS / m.group(2)).is_file() else "") + m.group(2), md)


def readme_text(nb: dict) -> str:
    "README.md text from a processed index notebook (nbdev-readme's job, without Quarto)."
    staged, fm = stage_nb(nb)
    parts = []
    for cell in staged["cells"]:
        src = _src(cell).strip()
        if cell["cell_type"] == "markdown":
            if src: parts.append(_readme_images(src))
        elif cell["cell_type"] == "code":
            if src and "hide-input" not in cell.get("metadata", {}).get("tags", []):
                parts.append("```python\n" + src + "\n```")
            parts.extend(t for t in map(_out_text, cell.get("outputs", [])) if t)
    head = "<!-- generated from nbs/index.ipynb by `python docs/build.py readme`; edit the notebook, not this file -->\n\n"
    return head + "\n\n".join(parts) + "\n"


def build_readme() -> Path:
    "Write README.md from nbs/index.ipynb, processed by nbdev first (as `nbdev-readme` does, without Quarto)."
    src = PROC / "index.ipynb"
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "_proc-one", str(NBS / "index.ipynb"), str(src)],
                       cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if r.returncode: raise SystemExit("docs: nbdev processing of nbs/index.ipynb failed")
    text = readme_text(json.loads(src.read_text(encoding="utf-8")))
    (ROOT / "README.md").write_text(text, encoding="utf-8")
    print(f"docs: README.md <- {src.relative_to(ROOT)}")
    return ROOT / "README.md"


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "site"
    if what == "_proc-one": proc_one(Path(sys.argv[2]), Path(sys.argv[3])); sys.exit(0)
    if what not in ("site", "readme", "all"): raise SystemExit(f"usage: {sys.argv[0]} [site|readme|all], got {what!r}")
    if what in ("site", "all"): build_site()
    if what in ("readme", "all"): build_readme()
