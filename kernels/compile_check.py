#!/usr/bin/env python
"""Compile every launch configuration of hqkv's Triton kernels ahead of time, for GPUs this machine does not have.

Nothing here needs a GPU. The launchers themselves (`hqkv.kernels.store/decode/prefill`, and `hqkv.vllm`'s
`store_rows`/`attend` as the vLLM plugin calls them) run on small CPU tensors with their `@triton.jit` kernels
swapped for recorders: each launch is kept, not run. Triton's own binder turns the recorded arguments into the
signature, constexprs, divisibility attributes and options a GPU launch would compile (so block sizes,
`num_warps` and `num_stages` are the launchers' own, read from `hqkv.kernels.TILES` through them, never copied
here), `triton.compile` builds PTX and a cubin for each target, and `ptxas -v` reports registers, spills and
stack. Shared memory is Triton's (`metadata.shared`, what a launch asks for).

    python kernels/compile_check.py                 # every configuration, sm_80 + sm_90 -> kernels/resources.md + JSON
    python kernels/compile_check.py --arch 80 90 100   # Blackwell too (the bundled ptxas-blackwell compiles it)
    python kernels/compile_check.py --quick         # head dims 80 and 256, GQA groups 1 and 8 (a few minutes)
    python kernels/compile_check.py --full          # every head dim 64-512, vLLM block sizes 16-128 (the same binaries, more launches)
    python kernels/compile_check.py --arch 90 --kernel prefill --head-dim 256   # one slice, printed
    python kernels/compile_check.py --format bf16 --turn on   # only the engine's launches with a turned mean (hqkv.keyprofile)
    python kernels/compile_check.py --format tbq4 --json /tmp/tbq4.json && python kernels/compile_check.py --merge /tmp/tbq4.json
                                                    # a slice's rows replace theirs in the saved JSON and the table
    python kernels/compile_check.py --path vllm --format tbq4 --json /tmp/v.json && python kernels/compile_check.py --merge /tmp/v.json --add
                                                    # other launches of saved formats: their rows join the saved ones

Exit status 1 names every configuration that cannot launch (shared memory over the arch's per-block limit,
more than 255 registers, a compile error) and every one that spills registers to local memory (--allow-spills: reported
only, for exploring tiles).
"""
from __future__ import annotations
import os
os.environ["TRITON_INTERPRET"] = "0"             # compile for real; the launchers are fooled about the device below
os.environ.setdefault("TRITON_ALWAYS_COMPILE", "1")   # ptxas must run (its log is the measurement)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said out loud (silences its warning)
import argparse, contextlib, io, itertools, json, re, sys, tempfile, time
from dataclasses import dataclass, field, asdict

os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="hqkv-kernel-check-"))
import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

import hqkv.kernels as K
import hqkv.kernels.store as store_mod
import hqkv.kernels.decode as decode_mod
import hqkv.kernels.prefill as prefill_mod
import hqkv.vllm as vllm_mod
from hqkv.attention import ExactWindow
from hqkv.codec import get_codec, codec_class

# Per-arch limits (CUDA programming guide, "Technical specifications per compute capability"): the largest
# dynamic shared memory one block may opt into, shared memory and registers per SM, threads per SM.
ARCHS = {
    80:  dict(name="sm_80 (A100)", smem_block=163 * 1024, smem_sm=164 * 1024, regs_sm=65536, threads_sm=2048, blocks_sm=32),
    90:  dict(name="sm_90 (H100/H200)", smem_block=227 * 1024, smem_sm=228 * 1024, regs_sm=65536, threads_sm=2048, blocks_sm=32),
    100: dict(name="sm_100 (B200)", smem_block=227 * 1024, smem_sm=228 * 1024, regs_sm=65536, threads_sm=2048, blocks_sm=32),
}
MAX_REGS = 255
GROUPS = tuple(range(1, 9))          # GQA group sizes (query heads per KV head)
VLLM_BLOCKS = (16, 128)              # vLLM --block-size: 16 (vLLM's default: K/V rows per step capped at the page) and 128; --full adds 32, 64
MIXED = ("tbq3/hq-e8-2b", "hq-e8-2b/tbq2", "q8_0/hq-e8-2b", "tbq4/tbq2")   # keys/values in different formats, as a bit plan makes them (engine only)

def formats_of(fmt:str) -> tuple[str, str]: return tuple(fmt.split("/")) if "/" in fmt else (fmt, fmt)
def reads(fmt:str, D:int) -> bool: return all(D in codec_class(f).head_dims for f in formats_of(fmt))

def head_dims(full=False):
    "Every head dim the kernels read (full), else the smallest and largest of each power-of-two block width."
    # D is a runtime argument, specialised only on D % 16 == 0 (true of all): every head dim of a width runs one binary
    if full: return K.KERNEL_HEAD_DIMS
    widths = {}
    for D in K.KERNEL_HEAD_DIMS: widths.setdefault(triton.next_power_of_2(D), []).append(D)
    return tuple(sorted({d for ds in widths.values() for d in (min(ds), max(ds))}))
ENGINE_PAGE = 64                     # KVPool page_tokens
KV_HEADS = 4                         # strides follow from it (Qwen3.5-27B's 4 KV heads); the kernels' code does not


# ---------------------------------------------------------------- recording the launchers' launches
@dataclass
class Launch:
    fn: object      # the JITFunction
    args: tuple
    kwargs: dict

class Recorder:
    "Stands in for a `@triton.jit` kernel inside a launcher: `kernel[grid](*args, **kw)` keeps the launch instead of running it."
    def __init__(self, fn, sink): self.fn, self.sink = fn, sink
    def __getitem__(self, grid): return lambda *a, **kw: self.sink.append(Launch(self.fn, a, kw))

KERNEL_NAMES = {store_mod: ("store_kernel",), decode_mod: ("decode_kernel", "decode_merge_kernel"), prefill_mod: ("prefill_kernel",)}

@contextlib.contextmanager
def recording(arch:int):
    "Launches made inside go to the returned list; the launchers see CPU tensors as a device and `arch` as its compute capability."
    sink, saved = [], []
    def patch(obj, name, val):
        saved.append((obj, name, getattr(obj, name))); setattr(obj, name, val)
    for mod, names in KERNEL_NAMES.items():
        for n in names: patch(mod, n, Recorder(getattr(mod, n), sink))
        patch(mod, "check_device", lambda *ts: ts[0].device)
    if hasattr(K, "device_arch"): patch(K, "device_arch", lambda dev=None: arch)
    try: yield sink
    finally:
        for obj, name, val in reversed(saved): setattr(obj, name, val)


# ---------------------------------------------------------------- the configurations: how the engine and the vLLM plugin call
@dataclass(frozen=True)
class Config:
    path: str        # "engine" (hqkv's PagedKV: pool pages) or "vllm" (the plugin: vLLM's LBHNC cache views)
    op: str          # store, decode, prefill
    fmt: str
    head_dim: int
    group: int = 0   # GQA group (0: the op does not read it)
    window: bool = False
    page: int = ENGINE_PAGE
    turn: bool = False   # a key profile with a turned mean (the engine only; with the window, as the engine runs it)
    def label(self) -> str:
        s = f"{self.path}/{self.op} {self.fmt} D={self.head_dim}"
        if self.group: s += f" G={self.group}"
        if self.op != "store": s += f" window={'on' if self.window else 'off'}"
        return s + (" turned" if self.turn else "") + f" page={self.page}"

def configs(quick=False, kernels=None, dims=None, formats=None, groups=None, blocks=None, windows=(False, True), paths=("engine", "vllm"), full=False,
            turns=(False, True)):
    groups = groups or ((1, 8) if quick else GROUPS)
    blocks = blocks or ((16, 32, 64, 128) if full else VLLM_BLOCKS)
    dims = dims or ((80, 256) if quick else head_dims(full))
    out = []
    for fmt, D in itertools.product(formats or (*K.KERNEL_FORMATS, *MIXED), dims):
        if not reads(fmt, D): continue              # q8_0/q4_0: whole 32-value blocks only
        mixed = "/" in fmt                           # the vLLM plugin keeps one format per layer group
        out.append(Config("engine", "store", fmt, D))
        out += [Config("vllm", "store", fmt, D, page=bs) for bs in blocks if not mixed]
        for G, win in itertools.product(groups, windows):
            for turn in [t for t in turns if win or not t]:   # turned: window on (its code is a superset of off's)
                out.append(Config("engine", "decode", fmt, D, G, win, turn=turn))
                out.append(Config("engine", "prefill", fmt, D, G, win, turn=turn))
            if False in turns: out += [Config("vllm", "prefill", fmt, D, G, win, page=bs) for bs in blocks if not mixed]
    return [c for c in out if (not kernels or c.op in kernels) and c.path in paths]

SPLITS = (2, 64)    # decode's split-K factor: default_splits picks 1..64 by SM count; these cover the merge's SPLITS_PAD extremes and the
                        # divisibility specialisations of SPLITS (a runtime int); the decode kernel itself does not depend on it

def turned(q, D, cfg): return (q, 1e4 ** -torch.arange(0, 1, 2 / D, dtype=torch.float64)) if cfg.turn else None

_CODECS = {}
def call(cfg:Config):
    "Run the launcher(s) the way `cfg.path` does, on CPU tensors (inside `recording`)."
    get = lambda f: get_codec(f, head_dim=cfg.head_dim, **({"allow": True} if f == "tbq3" else {}))
    if (cfg.fmt, cfg.head_dim) not in _CODECS:
        kc, vc = (get(f) for f in formats_of(cfg.fmt))
        _CODECS[cfg.fmt, cfg.head_dim] = kc if "/" not in cfg.fmt else (kc, vc)
    c = _CODECS[cfg.fmt, cfg.head_dim]
    kc, vc = c if isinstance(c, tuple) else (c, c)
    D, H, G, i32 = cfg.head_dim, KV_HEADS, max(cfg.group, 1), torch.int32
    B, pages_per_seq = 2, 3
    n_pages = B * pages_per_seq
    torch.manual_seed(0)
    if cfg.path == "engine":
        kp, vp = (torch.zeros(n_pages, cfg.page, H, x.row_bytes, dtype=torch.uint8) for x in (kc, vc))
    else:
        cache = torch.zeros(n_pages, H, cfg.page, 2 * c.row_bytes, dtype=torch.uint8)
        kp, vp = vllm_mod.kv_views(cache, c)
    win = ExactWindow.allocate(B, H, D, sinks=32 if cfg.path == "engine" else vllm_mod.WINDOW_SINKS, recent=512) if cfg.window else None
    indptr = torch.tensor([0, pages_per_seq, n_pages], dtype=i32)
    indices = torch.arange(n_pages, dtype=i32)
    if cfg.op == "store":
        T = 48
        x = torch.randn(T, H, D)
        slots = torch.randperm(n_pages * cfg.page)[:T]
        if cfg.path == "engine": store_mod.store(x, x, kp, vp, slots, c)
        else: vllm_mod.store_rows(cache, x, x, slots, c, kernels="triton")
    elif cfg.op == "decode":
        q = torch.randn(B, H * G, D)
        last = torch.tensor([cfg.page, cfg.page // 2], dtype=i32)
        for s in SPLITS:
            decode_mod.decode(q, kp, vp, indptr, indices, last, c, window=win, splits=s, turn=turned(q, D, cfg))
    else:
        chunk = 40
        T = B * chunk
        q, k = torch.randn(T, H * G, D), torch.randn(T, H, D)
        qo = torch.tensor([0, chunk, T], dtype=i32)
        prefix = torch.tensor([pages_per_seq * cfg.page, pages_per_seq * cfg.page - 5], dtype=i32)
        if cfg.path == "engine":
            prefill_mod.prefill(q, k, k, qo, kp, vp, indptr, indices, prefix, c, window=win, max_chunk=chunk, turn=turned(q, D, cfg))
        else:
            seq_lens = prefix + chunk
            bt = indices.reshape(B, pages_per_seq).long()
            batch = vllm_mod.PagedBatch(T, qo, prefix, indptr, indices, torch.zeros(T, dtype=torch.int64), cfg.page, bt)
            vllm_mod.attend(q, k, k, cache, batch, c, D ** -0.5, window=win, kernels="triton")


# ---------------------------------------------------------------- compiling one launch for one arch
@dataclass
class Result:
    kernel: str
    arch: int
    num_warps: int
    num_stages: int
    constexprs: dict
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0
    shared: int = 0
    blocks_per_sm: int = 0
    seconds: float = 0.0
    error: str = ""

PTXAS_RE = dict(registers=r"Used (\d+) registers", stack=r"(\d+) bytes stack frame", spill_stores=r"(\d+) bytes spill stores",
                spill_loads=r"(\d+) bytes spill loads")

def occupancy(arch, regs, shared, warps) -> int:
    "Resident blocks per SM the resources allow (registers allocated per warp in units of 256, 1 KiB of shared memory reserved per block)."
    a = ARCHS[arch]
    regs_warp = -(-max(regs, 1) * 32 // 256) * 256
    by_regs = a["regs_sm"] // (regs_warp * warps)
    by_smem = a["smem_sm"] // (shared + 1024)
    by_threads = a["threads_sm"] // (32 * warps)
    return max(0, min(by_regs, by_smem, by_threads, a["blocks_sm"]))

_BINDERS = {}
def _binder(fn, arch):
    "Triton's argument binder for `fn` on `arch`, and the target and backend (built once: they cost more than a launch)."
    if (fn, arch) not in _BINDERS:
        target = GPUTarget("cuda", arch, 32)
        backend = make_backend(target)
        _BINDERS[fn, arch] = target, backend, create_function_from_signature(fn.signature, fn.params, backend)
    return _BINDERS[fn, arch]

def launch_key(launch:Launch, arch:int):
    "What Triton would compile for this launch on `arch`: (fn, signature, constexprs, attrs, options) and a hashable key."
    fn = launch.fn
    target, backend, binder = _binder(fn, arch)
    bound, spec, opts = binder(*launch.args, **launch.kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, launch.kwargs, bound, spec, opts)
    named = {fn.arg_names[k[0]]: v for k, v in constexprs.items()}
    key = (fn.__name__, arch, json.dumps(signature, sort_keys=True), repr(sorted(constexprs.items())), repr(sorted(attrs.items())),
           options.num_warps, options.num_stages)
    return key, (target, fn, signature, constexprs, attrs, options, named)

def compile_one(target, fn, signature, constexprs, attrs, options, named) -> Result:
    r = Result(fn.__name__, target.arch, options.num_warps, options.num_stages, dict(named))
    t0 = time.perf_counter()
    buf = io.StringIO()
    knobs.nvidia.dump_ptxas_log = True
    try:
        with contextlib.redirect_stdout(buf):
            k = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
        log = buf.getvalue()
        for name, rx in PTXAS_RE.items():
            m = re.search(rx, log)
            setattr(r, name, int(m.group(1)) if m else 0)
        r.shared = int(k.metadata.shared)
        r.blocks_per_sm = occupancy(target.arch, r.registers, r.shared, r.num_warps)
    except Exception as e:   # a compile error is a result: the configuration cannot launch
        msg = str(e).strip().splitlines()
        r.error = f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]
    r.seconds = round(time.perf_counter() - t0, 2)
    return r

def problems(r:Result) -> list[str]:
    "Why the configuration cannot launch (empty: it can)."

    a = ARCHS[r.arch]
    out = []
    if r.error: out.append(f"compile error ({r.error})")
    else:
        if r.shared > a["smem_block"]: out.append(f"shared memory {r.shared / 1024:.0f} KiB > {a['smem_block'] // 1024} KiB")
        if r.registers > MAX_REGS: out.append(f"{r.registers} registers > {MAX_REGS}")
    return out

def spills(r:Result) -> list[str]:
    "Why the configuration fails without --allow-spills (empty: it spills nothing)."
    return [f"spills {r.spill_stores}/{r.spill_loads} B"] if r.spill_stores or r.spill_loads else []


# ---------------------------------------------------------------- the report
def kib(b): return f"{b / 1024:.0f}" if b >= 10 * 1024 or b == 0 else f"{b / 1024:.1f}"

def summary_rows(rows:list[dict]) -> list[dict]:
    "One row per (kernel, format, head_dim, arch): the worst over GQA groups, window on/off, paths and page sizes."
    groups = {}
    for r in rows:
        groups.setdefault((r["kernel"], r["fmt"], r["head_dim"], r["arch"]), []).append(r)
    out = []
    for (kern, fmt, D, arch), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][3])):
        ok = [r for r in rs if not r["error"]]
        worst = max(rs, key=lambda r: (bool(r["error"]), r["shared"], r["spill_stores"] + r["spill_loads"], r["registers"]))
        out.append(dict(kernel=kern, fmt=fmt, head_dim=D, arch=arch, configs=len(rs), errors=len(rs) - len(ok),
                        registers=max((r["registers"] for r in ok), default=0),
                        spill_stores=max((r["spill_stores"] for r in ok), default=0), spill_loads=max((r["spill_loads"] for r in ok), default=0),
                        stack=max((r["stack"] for r in ok), default=0), shared=max((r["shared"] for r in ok), default=0),
                        blocks_per_sm=min((r["blocks_per_sm"] for r in ok), default=0),
                        num_warps=sorted({r["num_warps"] for r in rs}), num_stages=sorted({r["num_stages"] for r in rs}),
                        tiles=sorted({_tiles(r) for r in rs}), launchable=all(not r["problems"] for r in rs),
                        worst=worst["config"]))
    return out

def _tiles(r):
    c = r["constexprs"]
    return " ".join(f"{k}={c[k]}" for k in ("BLOCK_M", "BLOCK_N", "BLOCK_T", "PB", "SPLITS_PAD") if k in c)

def table_md(summary:list[dict]) -> str:
    head = ("| kernel | format | head dim | arch | configs | registers | spill st/ld (B) | stack (B) | shared (KiB) | blocks/SM | warps | stages | tiles | launchable |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for s in summary:
        lines.append(f"| {s['kernel']} | {s['fmt']} | {s['head_dim']} | sm_{s['arch']} | {s['configs']} | {s['registers']} | "
                     f"{s['spill_stores']} / {s['spill_loads']} | {s['stack']} | {kib(s['shared'])} | {s['blocks_per_sm']} | "
                     f"{'/'.join(map(str, s['num_warps']))} | {'/'.join(map(str, s['num_stages']))} | {'; '.join(s['tiles'])} | "
                     f"{'yes' if s['launchable'] else '**no**'}{_errors(s)} |")
    return head + "\n".join(lines) + "\n"

def _errors(s): return f" ({s['errors']} compile errors)" if s["errors"] else ""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, nargs="*", default=None, help="compute capabilities (default: 80 90; 100 compiles too, with the bundled ptxas-blackwell)")
    ap.add_argument("--kernel", nargs="*", choices=("store", "decode", "prefill"), default=None)
    ap.add_argument("--head-dim", type=int, nargs="*", default=None)
    ap.add_argument("--format", nargs="*", default=None)
    ap.add_argument("--quick", action="store_true", help="head dims 80 and 256, GQA groups 1 and 8 (a few minutes)")
    ap.add_argument("--full", action="store_true", help="every head dim 64-512 and vLLM block sizes 16, 32, 64, 128 (the same binaries, many more launches)")
    ap.add_argument("--groups", type=int, nargs="*", default=None, help="GQA group sizes (default 1-8)")
    ap.add_argument("--blocks", type=int, nargs="*", default=None, help="vLLM block sizes (default 16 128)")
    ap.add_argument("--window", choices=("on", "off"), default=None, help="only this window setting (default both)")
    ap.add_argument("--path", choices=("engine", "vllm"), default=None, help="only the engine's or the vLLM plugin's launches (default both)")
    ap.add_argument("--turn", choices=("on", "off"), default=None, help="only launches with (on) or without (off) a turned mean (default both)")
    ap.add_argument("--allow-spills", action="store_true", help="report spills, fail only on what cannot launch")
    ap.add_argument("--json", default=None, help="write every row here (default with no slice: nbs/results/kernel_resources.json)")
    ap.add_argument("--md", default=None, help="write the table here (default with no slice: kernels/resources.md's generated part)")
    ap.add_argument("--label", default="", help="a name for this run in the JSON (e.g. before/after)")
    ap.add_argument("--render", action="store_true", help="only rewrite kernels/resources.md from nbs/results/kernel_resources.json (no compiling)")
    ap.add_argument("--merge", nargs="+", default=None, help="JSON files of sliced runs (--json): their rows replace the saved run's for "
                    "the same kernel, format, head dim and arch in nbs/results/kernel_resources.json and kernels/resources.md (no compiling)")
    ap.add_argument("--note", default="", help="with --merge: what the saved run's remaining rows are (e.g. an older kernel)")
    ap.add_argument("--add", action="store_true", help="with --merge: the slices compiled other configurations (e.g. --path "
                    "vllm) of formats the saved run has: their rows join the saved ones instead of replacing them")
    a = ap.parse_args(argv)
    if a.merge:
        out = merge(json.load(open("nbs/results/kernel_resources.json")), [json.load(open(f)) for f in a.merge], a.note, a.add)
        with open("nbs/results/kernel_resources.json", "w") as f: json.dump(out, f, default=str)
        write_md("kernels/resources.md", table_md(out["summary"]), out)
        return 0
    if a.render:
        out = json.load(open("nbs/results/kernel_resources.json"))
        write_md("kernels/resources.md", table_md(out["summary"]), out)
        return 0
    archs = a.arch or [80, 90]
    sliced = bool(a.kernel or a.head_dim or a.format or a.arch or a.quick or a.groups or a.blocks or a.window or a.path or a.turn)
    cfgs = configs(a.quick, a.kernel, a.head_dim, a.format, a.groups, a.blocks,
                   (a.window == "on",) if a.window else (False, True), (a.path,) if a.path else ("engine", "vllm"), a.full,
                   (a.turn == "on",) if a.turn else (False, True))
    t_start = time.perf_counter()
    cache, rows, failed, seen_by = {}, [], [], {}
    for arch in archs:
        for cfg in cfgs:
            with recording(arch) as launches:
                call(cfg)
            seen = set()
            for L in launches:
                key, spec = launch_key(L, arch)
                if key in seen: continue
                seen.add(key)
                if key not in cache:
                    cache[key] = compile_one(*spec)
                r = cache[key]
                ps = problems(r)
                fmt = cfg.fmt + (" turned" if cfg.turn else "")   # a turned mean's launches: rows of their own
                u = seen_by.setdefault(key, dict(paths=set(), fmt=fmt, head_dims=set(), groups=set(), windows=set(), pages=set(), configurations=0))
                u["paths"].add(cfg.path); u["head_dims"].add(cfg.head_dim); u["groups"].add(cfg.group); u["windows"].add(cfg.window)
                u["pages"].add(cfg.page); u["configurations"] += 1
                row = dict(config=cfg.label(), path=cfg.path, op=cfg.op, fmt=fmt, head_dim=cfg.head_dim, group=cfg.group,
                           window=cfg.window, page=cfg.page, turn=cfg.turn, **asdict(r), problems=ps)
                rows.append(row)
                bad = ps + ([] if a.allow_spills else spills(r))
                if bad: failed.append(f"{cfg.label()} {r.kernel} sm_{arch}: {'; '.join(bad)}")
                print(f"{cfg.label():58s} {r.kernel:20s} sm_{arch:<3d} regs {r.registers:3d} spill {r.spill_stores:5d}/{r.spill_loads:<5d} "
                      f"smem {kib(r.shared):>4s} KiB  warps {r.num_warps} stages {r.num_stages}  {_tiles(row)}  {r.seconds:5.1f}s"
                      + (f"  !! {'; '.join(ps)}" if ps else ""), flush=True)
    elapsed = time.perf_counter() - t_start
    summary = summary_rows(rows)
    compiled = [dict(**asdict(cache[k]), problems=problems(cache[k]), **{n: sorted(v) if isinstance(v, set) else v for n, v in u.items()})
                for k, u in seen_by.items()]
    out = dict(label=a.label, triton=triton.__version__, seconds=round(elapsed, 1), compiles=len(cache), configurations=len(cfgs),
               archs=archs, limits={str(k): v for k, v in ARCHS.items() if k in archs}, summary=summary, compiled=compiled)
    js = a.json or (None if sliced else "nbs/results/kernel_resources.json")
    if js:
        with open(js, "w") as f: json.dump(out, f, default=str)
    md = table_md(summary)
    if a.md or not sliced:
        write_md(a.md or "kernels/resources.md", md, out)
    print(f"\n{len(cfgs)} configurations x {len(archs)} archs, {len(cache)} distinct compiles, {elapsed:.0f} s")
    print(md)
    n_spill = sum(1 for r in rows if r["spill_stores"] or r["spill_loads"])
    if n_spill: print(f"{n_spill} of {len(rows)} configuration rows spill (see the table)")
    if failed:
        print(f"\n{len(failed)} configurations cannot launch{'' if a.allow_spills else ' or spill'}:", file=sys.stderr)
        for f in failed: print("  " + f, file=sys.stderr)
        return 1
    return 0

def _run(out, formats, note=""):
    "What one run compiled, for the record of a merged table."
    return dict(formats=sorted(formats), archs=out["archs"], configurations=out["configurations"], compiles=out["compiles"],
                seconds=out["seconds"], triton=out["triton"], label=out.get("label", ""), note=note)

def combine(a:dict, b:dict) -> dict:
    "Two summary rows of one (kernel, format, head dim, arch) from runs of different configurations (paths), as one."
    worst = max((a, b), key=lambda s: (not s["launchable"], s["shared"], s["spill_stores"] + s["spill_loads"], s["registers"]))
    big = {n: max(a[n], b[n]) for n in ("registers", "spill_stores", "spill_loads", "stack", "shared")}
    return dict(a, **big, configs=a["configs"] + b["configs"], errors=a["errors"] + b["errors"],
                blocks_per_sm=min(a["blocks_per_sm"], b["blocks_per_sm"]), launchable=a["launchable"] and b["launchable"],
                **{n: sorted(set(a[n]) | set(b[n])) for n in ("num_warps", "num_stages", "tiles")}, worst=worst["worst"])

def merge(base:dict, parts:list[dict], note:str="", add:bool=False) -> dict:
    "The saved run with the rows of `parts` (sliced runs) in place of its own for the same (kernel, format, head dim, arch)."
    # add: the parts compiled other configurations of the same kernels (e.g. the vLLM plugin's launches beside the
    # engine's saved ones): their rows join the saved ones instead of replacing them, and every saved run stays on record
    keys = {(s["kernel"], s["fmt"], s["head_dim"], s["arch"]) for p in parts for s in p["summary"]}
    key = lambda r: (r["kernel"], r["fmt"], r["head_dim"], r["arch"])
    if add:
        saved = {key(s): s for s in base["summary"]}
        parts = [dict(p, summary=[combine(saved[key(s)], s) if key(s) in saved else s for s in p["summary"]]) for p in parts]
    summary = sorted([s for s in base["summary"] if key(s) not in keys] + [s for p in parts for s in p["summary"]], key=key)
    served = lambda c: not add and all((c["kernel"], c["fmt"], d, c["arch"]) in keys for d in c["head_dims"])
    compiled = [c for c in base["compiled"] if not served(c)] + [c for p in parts for c in p["compiled"]]
    left = {s["fmt"] for s in base["summary"] if add or key(s) not in keys}
    runs = [dict(r, formats=[f for f in r["formats"] if f in left]) for r in base.get("runs", [_run(base, left, note)])]
    runs = [r for r in runs if r["formats"]] + [_run(p, {s["fmt"] for s in p["summary"]}) for p in parts]
    return dict(base, summary=summary, compiled=compiled, runs=runs, archs=sorted({a for r in runs for a in r["archs"]}),
                configurations=sum(r["configurations"] for r in runs), compiles=sum(r["compiles"] for r in runs),
                seconds=sum(r["seconds"] for r in runs))

MD_START, MD_END = "<!-- kernel-check: generated, do not edit -->", "<!-- /kernel-check -->"
BEFORE = "nbs/results/kernel_resources_before.json"   # the kernels as issue 31 found them (d2ffc25), same check

def compiled_for(after:dict, r:dict):
    "The compile in `after` that serves the configuration of row `r` (same kernel, arch, path, format, head dim, group, window, page)."
    for c in after["compiled"]:
        if (c["kernel"], c["arch"], c["fmt"]) == (r["kernel"], r["arch"], r["fmt"]) and r["path"] in c["paths"] and r["head_dim"] in c["head_dims"] \
           and r["group"] in c["groups"] and r["window"] in c["windows"] and r["page"] in c["pages"]: return c

def compare_md(before:dict, after:dict) -> str:
    "Before/after per (kernel, format, head dim, arch) on the configurations both runs compiled."
    pairs = {}
    for r in before["rows"]:
        c = compiled_for(after, r) if r["kernel"] != "decode_merge_kernel" else None
        if c is not None: pairs.setdefault((r["kernel"], r["fmt"], r["head_dim"], r["arch"]), []).append((r, c))
    if not pairs: return ""
    def cell(r): return "error" if r["error"] else f"{r['registers']} / {r['spill_stores']} B / {kib(r['shared'])} KiB" + ("" if not r["problems"] else " **x**")
    lines = ["| kernel | format | head dim | arch | before: registers / spill stores / shared | after | after: blocks/SM |", "|---|---|---|---|---|---|---|"]
    for (kern, fmt, D, arch), ps in sorted(pairs.items()):
        b = max((p[0] for p in ps), key=lambda r: (r["shared"], r["spill_stores"]))
        a = max((p[1] for p in ps), key=lambda r: (r["shared"], r["spill_stores"]))
        lines.append(f"| {kern} | {fmt} | {D} | sm_{arch} | {cell(b)} | {cell(a)} | {a['blocks_per_sm']} |")
    cfgs = sorted({p[0]["config"].split(" ", 1)[0] + " " + p[0]["config"].split(" D=")[1].split(" ", 1)[1] for ps in pairs.values() for p in ps})
    return (f"Before (the kernels at {before.get('label') or 'the start'}, `{BEFORE}`) and after, on the configurations the before run compiled "
            f"({', '.join(cfgs)}); **x**: cannot launch.\n\n" + "\n".join(lines) + "\n")

def write_md(path, table, out):
    "Replace the generated part of `path` (between the markers) with this run's table, keeping the prose around it."
    if out.get("runs"):
        runs = "; ".join(f"{', '.join(r['formats'])} on {', '.join(f'sm_{a}' for a in r['archs'])}: {r['configurations']} configurations, "
                         f"{r['compiles']} distinct compiles in {r['seconds']:.0f} s" + (f" ({r.get('note') or r.get('label')})" if r.get("note")
                         or r.get("label") else "") for r in out["runs"])
        what = f"`make kernel-check` on Triton {out['triton']}, merged from sliced runs (`--merge`): {runs}. "
    else:
        what = (f"`make kernel-check` on Triton {out['triton']}: {out['configurations']} configurations x "
                f"{len(out['archs'])} archs, {out['compiles']} distinct compiles in {out['seconds']:.0f} s wall-clock (one process, on a "
                f"machine of 2 cores shared with other jobs). ")
    body = (f"{MD_START}\n{what}"
            f"One row per (kernel, format, head dim, arch): the worst over the GQA groups, window on/off, the engine's "
            f"pages and vLLM's block sizes its run compiled; every configuration is in `nbs/results/kernel_resources.json`.\n\n{table}")
    if os.path.exists(BEFORE):
        body += "\n" + compare_md(json.load(open(BEFORE)), out)
    body += MD_END
    old = open(path).read() if os.path.exists(path) else "# Kernel resources\n\n" + MD_START + MD_END
    if MD_START in old and MD_END in old:
        new = old[:old.index(MD_START)] + body + old[old.index(MD_END) + len(MD_END):]
    else: new = old.rstrip() + "\n\n" + body + "\n"
    with open(path, "w") as f: f.write(new)

if __name__ == "__main__":
    sys.exit(main())
