"""hqkv's layers, lowest first: a module imports only from layers below its own (or its own package), at the top of the
file or inside a function alike, and no import cycle exists. The order is the architecture; change it here, on purpose."""
import ast
from pathlib import Path
import pytest

PKG = Path(__file__).resolve().parents[1] / "hqkv"

LAYERS = [  # lowest first; a module may import any module of a lower layer
    ["rotation", "precision", "testing", "sampling"],   # nothing of hqkv
    ["models.identity"],                # a model's name, identity and files (nothing of hqkv either)
    ["codec", "native"],                # the row formats (codec.* is one package); building the C++ kernels
    ["layer_formats"],                  # the one grammar of per-layer and per-KV-head formats
    ["sizing", "fixtures"],             # bytes per token, geometries; shipped texts and data
    ["texts"],                          # the evaluation texts (whole or shipped excerpts) and their windows
    ["bitplan"],                        # the per-row plan type and its search (pure)
    ["keyprofile"],                     # the profile type, its files, which one a cache uses
    ["keystats"],                       # a profile's statistics from captured keys and queries (mu, sigma, a rotation)
    ["models.load"],                    # any transformers causal LM, its geometry
    ["attention"],                      # attention over pages: the reference, its checks
    ["layer_maps"],                     # a layer's fixed maps folded into matrices (the CPU kernels apply them)
    ["kernels", "attention_cpu", "window"],   # the Triton and CPU kernels; the exact window
    ["models.weights"],                 # int8, int4, bf16 and float32 linear layers (built like the CPU attention kernels)
    ["allocator"],                      # the pool's bookkeeping: pages, reservations, prefix index (no tensors)
    ["pool"],                           # pages in bytes
    ["backends", "scheduler", "lean"],  # attention backends behind one protocol; admission; decoder layers in a few calls
    ["pagedkv", "seqkv"],               # the per-step KV manager; one sequence's coded K/V in one layer (hf's rows)
    ["hf", "model_runner"],             # transformers' cache and attention hooks
    ["variants"],                       # what a quality run changes, and the paged K/V it gives a sequence
    ["quality"],                        # KLD, needles, tables (re-exports texts and variants)
    ["calibrate"],                      # measuring profiles and row sensitivities
    ["capture"],                        # q, k, v of a model's full-attention layers; the real-K/V fixture it makes
    ["settings", "monitor"],            # the engine's settings; pool metrics
    ["model_cache"],                    # the engine's model: loaded once per process, device checks, stop ids
    ["engine"],
    ["openai_api", "loadtest"],         # OpenAI request fields checked at the door; streaming clients for a load test
    ["cli", "serve", "vllm"],           # ... vllm: the vLLM plugin's settings, pages and attention (no vLLM import)
    ["vllm_backend"],                   # the plugin's vLLM classes (imports vllm at its top; only vLLM imports it)
    ["commands"],                       # the command line's commands (imports everything)
]

def _module(p:Path) -> str:
    parts = p.relative_to(PKG).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

def _unit(mod:str) -> str:
    "The layered unit a module belongs to: itself, or its package (codec.e8 -> codec, kernels.decode -> kernels)."
    for layer in LAYERS:
        for u in layer:
            if mod == u or mod.startswith(u + "."): return u
    return mod

RANK = {u: i for i, layer in enumerate(LAYERS) for u in layer}

def imports(p:Path) -> list: # [(imported module, line)], relative imports resolved, hqkv's own only
    mod, out = _module(p), []
    pkg = mod.split(".") if p.name == "__init__.py" else mod.split(".")[:-1]
    for n in ast.walk(ast.parse(p.read_text())):
        if isinstance(n, ast.ImportFrom):
            if n.level: base = ".".join(pkg[:len(pkg) - n.level + 1] + ([n.module] if n.module else []))
            elif (n.module or "").startswith("hqkv."): base = n.module[5:]
            else: continue
            for a in n.names:   # `from . import x` / `from .codec import e8`: x may be a module
                sub = f"{base}.{a.name}" if base else a.name
                out.append((sub if (PKG / sub.replace(".", "/")).with_suffix(".py").exists() or (PKG / sub.replace(".", "/")).is_dir() else base, n.lineno))
        elif isinstance(n, ast.Import):
            out += [(a.name[5:], n.lineno) for a in n.names if a.name.startswith("hqkv.")]
    return [(m, l) for m, l in out if m]

def graph() -> dict: # unit -> {unit it imports: first 'file:line'}
    g = {}
    for p in _sources():
        u = _unit(_module(p))
        for m, line in imports(p):
            v = _unit(m)
            if v != u: g.setdefault(u, {}).setdefault(v, f"{p.relative_to(PKG.parent)}:{line}")
    return g

def _sources():
    "hqkv's modules (not the generated index, not an empty package marker)."
    return [p for p in sorted(PKG.rglob("*.py")) if p.name != "_modidx.py" and _module(p) and (p.name != "__init__.py" or p.read_text().strip())]

def test_every_module_has_a_layer():
    mods = {_unit(_module(p)) for p in _sources()}
    assert not sorted(mods - set(RANK)), f"modules with no layer in LAYERS: {sorted(mods - set(RANK))}"

def test_no_upward_or_sideways_import():
    bad = [f"{where}: {u} (layer {RANK[u]}) imports {v} (layer {RANK[v]})"
           for u, deps in graph().items() for v, where in deps.items() if v in RANK and u in RANK and RANK[v] >= RANK[u]]
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)

def test_no_import_cycle():
    g, state, path = graph(), {}, []
    def visit(u):
        state[u] = 1; path.append(u)
        for v in g.get(u, {}):
            if state.get(v) == 1: raise AssertionError("import cycle: " + " -> ".join(path[path.index(v):] + [v]))
            if not state.get(v): visit(v)
        state[u] = 2; path.pop()
    for u in list(g):
        if not state.get(u): visit(u)

def test_the_checks_catch_a_bad_import(tmp_path):
    "The walker sees function-level and relative imports: a planted upward import inside a function is reported."
    global PKG
    fake = tmp_path / "hqkv"; (fake / "models").mkdir(parents=True)
    (fake / "__init__.py").write_text(""); (fake / "models" / "__init__.py").write_text("")
    (fake / "models" / "identity.py").write_text("def f():\n    from ..engine import Engine\n")
    (fake / "engine.py").write_text("from .models.identity import f\n")
    old, PKG = PKG, fake
    try:
        with pytest.raises(AssertionError, match=r"models/identity.py:2: models.identity \(layer 1\) imports engine"): test_no_upward_or_sideways_import()
        with pytest.raises(AssertionError, match="import cycle"): test_no_import_cycle()
    finally: PKG = old
