"""
Attention kernel benchmark
==========================

Decode-step attention time on the 27B geometry (24 query heads, 4 KV heads x 256, pages of 64):

* ``hq-e8-2b`` pages through ``hqkv.kernels.decode`` (codes decoded in registers),
* ``bf16`` pages through the same kernel family,
* ``torch.nn.functional.scaled_dot_product_attention`` over a dense bf16 cache of the same size,

at 4K / 32K / 128K context, batch 1 and 8; then one 1024-token prefill chunk over a 32K compressed
prefix (``hqkv.kernels.prefill``, both formats) against SDPA over the dense bf16 prefix + chunk. Every
time is the median of ``triton.testing.do_bench``; the table also gives each kernel's time as a ratio
to SDPA and hq-e8-2b's to bf16, measured in the same run, and the KV bytes each reads. No exact window
(it adds the same 544 exact rows to both formats). Run on a GPU machine (about 2 minutes)::

    python kernels/bench_attention.py [--out kernels/results.md]
    python kernels/bench_attention.py --tiny   # tiny shapes under TRITON_INTERPRET=1: checks the script runs
    python kernels/bench_attention.py --tiles 16/8/2 32/4/2 64/8/2   # also hq-e8-2b decode at each tile (rows/warps/stages)

``--tiles`` times hq-e8-2b's decode with each tile in place of the launcher's (``hqkv.kernels.FORMAT_TILES``,
chosen by the compiled loops' instruction counts, ``kernels/sass.py``): the measurement that confirms or
overturns that choice. Its table follows the main one.

Correctness is ``kernels/check_attention.py``'s job; this script only spot-checks that each kernel's
output is finite and close to SDPA over the same tokens (for bf16).
"""

# %%
# Setup
# -----
import argparse, os, sys, time

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--tiny", action="store_true", help="tiny shapes (runs under the Triton interpreter without a GPU)")
parser.add_argument("--out", default=None, help="also write the markdown table to this file")
def tile_arg(t:str) -> tuple[int, int, int]:
    "BLOCK_N/WARPS/STAGES, e.g. 32/4/2."
    try:
        bn, w, st = map(int, t.split("/"))
        assert bn > 0 and bn & (bn - 1) == 0 and w in (1, 2, 4, 8, 16) and st >= 1
        return bn, w, st
    except (ValueError, AssertionError):
        raise argparse.ArgumentTypeError(f"{t!r}: a tile is BLOCK_N/WARPS/STAGES, e.g. 32/4/2 (BLOCK_N a power of two)")
parser.add_argument("--tiles", nargs="*", type=tile_arg, default=[],
                    help="hq-e8-2b decode tiles to time too, as BLOCK_N/WARPS/STAGES (needs a GPU)")
args = parser.parse_args()

import torch
if not torch.cuda.is_available():
    if not args.tiny: sys.exit("bench_attention: no CUDA device; run with --tiny to exercise the script under the Triton interpreter")
    if args.tiles: sys.exit("bench_attention --tiles: no CUDA device (the interpreter reads its own tile, not a GPU's)")
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
import torch.nn.functional as F
import triton

from hqkv.codec import get_codec, list_codecs
from hqkv.kernels.decode import decode, DecodeWorkspace
from hqkv.kernels.prefill import prefill

if args.tiny: HQ, HKV, D, CONTEXTS, BATCHES, PREFIX, CHUNK = 6, 1, 64, [256, 512], [1, 2], 256, 32
else: HQ, HKV, D, CONTEXTS, BATCHES, PREFIX, CHUNK = 24, 4, 256, [4096, 32768, 131072], [1, 8], 32768, 1024
from hqkv.kernels import KERNEL_FORMATS
FORMATS = [f for f in (("hq-e8-2b", "bf16") if args.tiny else ("hq-e8-2b", "bf16", *KERNEL_FORMATS)) if f in list_codecs()]
FORMATS = list(dict.fromkeys(FORMATS))   # every format the kernels read on a GPU; the two of the issue under the interpreter
i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=DEV)

def bench(fn):
    "Median milliseconds: do_bench on a GPU, a few perf_counter runs under the interpreter."
    if DEV == "cuda": return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    ts = []
    for _ in range(3):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return sorted(ts)[1] * 1e3

def make_pages(codec, n_pages, seed=0):
    "n_pages distinct pages (real memory), all holding one random page's codes: timing does not depend on content."
    g = torch.Generator().manual_seed(seed)
    one = codec.encode(torch.randn(64, HKV, D, generator=g)).to(DEV)
    return one[None].expand(n_pages, -1, -1, -1).contiguous(), codec.decode(one.cpu()).to(DEV)

# %%
# Decode
# ------
rows = []
for ctx in CONTEXTS:
    for B in BATCHES:
        n = ctx // 64
        q = torch.randn(B, HQ, D, device=DEV, dtype=torch.bfloat16)
        ip, idx, lpl = i32([b * n for b in range(B + 1)]), torch.arange(B * n, dtype=torch.int32, device=DEV), i32([64] * B)
        row = dict(context=ctx, batch=B)
        dense = None
        for name in FORMATS:
            codec = get_codec(name, head_dim=D, **({"allow": True} if name == "tbq3" else {}))
            kp, one_k = make_pages(codec, B * n, 1); vp, one_v = make_pages(codec, B * n, 2)
            ws = DecodeWorkspace.allocate(B, HKV, HQ // HKV, D, 64, DEV)
            o = decode(q, kp, vp, ip, idx, lpl, codec, workspace=ws)
            if name == "bf16":   # the same tokens as a dense bf16 cache for SDPA
                dense = (one_k.to(torch.bfloat16).transpose(0, 1)[None].repeat(B, 1, n, 1), one_v.to(torch.bfloat16).transpose(0, 1)[None].repeat(B, 1, n, 1))
                ref = F.scaled_dot_product_attention(q[:, :, None], *dense, enable_gqa=True)[:, :, 0]
                err = float((o.float() - ref.float()).abs().max() / ref.float().norm(dim=-1).max())
                assert err < 1e-2, f"bf16 decode differs from SDPA: {err}"
            assert torch.isfinite(o).all(), name
            row[f"{name} ms"] = bench(lambda: decode(q, kp, vp, ip, idx, lpl, codec, workspace=ws))
            row[f"{name} KV MB"] = 2 * kp.numel() / 2**20
            del kp, vp
        if dense is None:
            kd = torch.randn(B, HKV, ctx, D, device=DEV, dtype=torch.bfloat16); dense = (kd, torch.randn_like(kd))
        row["sdpa bf16 ms"] = bench(lambda: F.scaled_dot_product_attention(q[:, :, None], *dense, enable_gqa=True))
        del dense
        rows.append(row)
        print(row, flush=True)

# %%
# Prefill: one chunk over a compressed prefix
# -------------------------------------------
prow = dict(context=PREFIX, batch=1)
L = PREFIX + CHUNK
q = torch.randn(CHUNK, HQ, D, device=DEV, dtype=torch.bfloat16)
kn, vn = torch.randn(CHUNK, HKV, D, device=DEV), torch.randn(CHUNK, HKV, D, device=DEV)
n = -(-L // 64)
for name in FORMATS:
    codec = get_codec(name, head_dim=D, **({"allow": True} if name == "tbq3" else {}))
    kp, _ = make_pages(codec, n, 1); vp, _ = make_pages(codec, n, 2)
    args_ = (q, kn, vn, i32([0, CHUNK]), kp, vp, i32([0, n]), torch.arange(n, dtype=torch.int32, device=DEV), i32([PREFIX]), codec)
    assert torch.isfinite(prefill(*args_, max_chunk=CHUNK)).all(), name
    prow[f"{name} ms"] = bench(lambda: prefill(*args_, max_chunk=CHUNK))
    prow[f"{name} KV MB"] = 2 * kp.numel() / 2**20
    del kp, vp
kd = torch.randn(1, HKV, L, D, device=DEV, dtype=torch.bfloat16); vd = torch.randn_like(kd)
mask = torch.ones(CHUNK, L, dtype=torch.bool, device=DEV).tril(PREFIX)
qs = q.transpose(0, 1)[None]
prow["sdpa bf16 ms"] = bench(lambda: F.scaled_dot_product_attention(qs, kd, vd, attn_mask=mask, enable_gqa=True))
print(prow, flush=True)

# %%
# Table
# -----
dev_name = torch.cuda.get_device_name() if DEV == "cuda" else "CPU (Triton interpreter: times mean nothing)"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from roofline import spec_for, predict_decode      # the roofline model beside the measurement (kernels/roofline.md)
gpu = spec_for(dev_name) or "H100-SXM5-80GB"
for r in rows:
    for name in FORMATS: r[f"model {name} ms"] = predict_decode(gpu, name, D, HQ, HKV, r["context"], r["batch"])["us"] / 1e3
lines = [f"Device: {dev_name}; torch {torch.__version__}, triton {triton.__version__}; geometry {HQ} q heads, {HKV} kv heads x {D}. "
         f"Model columns: kernels/roofline.py's prediction for {gpu}{'' if spec_for(dev_name) else ' (this device is not modelled)'}.", "",
         "| op | context | batch | hq-e8-2b ms | bf16 ms | SDPA bf16 ms | e8 / bf16 | e8 / SDPA | bf16 / SDPA | e8 KV MiB | bf16 KV MiB | model e8 ms | model bf16 ms |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
def fmt(r, k): return f"{r[k]:.3f}" if k in r else "-"
def ratio(r, a, b): return f"{r[a] / r[b]:.2f}" if a in r and b in r else "-"
for op, rs in (("decode", rows), (f"prefill {CHUNK}", [prow])):
    for r in rs:
        lines.append(f"| {op} | {r['context']} | {r['batch']} | {fmt(r, 'hq-e8-2b ms')} | {fmt(r, 'bf16 ms')} | {fmt(r, 'sdpa bf16 ms')} | "
                     f"{ratio(r, 'hq-e8-2b ms', 'bf16 ms')} | {ratio(r, 'hq-e8-2b ms', 'sdpa bf16 ms')} | {ratio(r, 'bf16 ms', 'sdpa bf16 ms')} | "
                     f"{fmt(r, 'hq-e8-2b KV MB')} | {fmt(r, 'bf16 KV MB')} | {fmt(r, 'model hq-e8-2b ms')} | {fmt(r, 'model bf16 ms')} |")

# %%
# hq-e8-2b's decode at other tiles (--tiles)
# -------------------------------------------
import hqkv.kernels as K
if args.tiles and DEV == "cuda":
    row = min(d for k, d in K.TILES if k == "decode" and d >= D)
    key, saved = ("decode", row, "hq-e8-2b"), K.FORMAT_TILES.get(("decode", row, "hq-e8-2b"))
    arch = max(a for a in K.TILES["decode", row] if a is not None and a <= max(K.device_arch(DEV), 80))   # as arch_tile
    codec = get_codec("hq-e8-2b", head_dim=D)
    names = ["/".join(map(str, t)) for t in args.tiles]
    lines += ["", f"hq-e8-2b decode ms by tile (rows a step / warps / stages; the launcher's: "
              f"{K.tile('decode', D, DEV, 'hq-e8-2b')}):", "", "| context | batch | " + " | ".join(names) + " |",
              "|---|---|" + "---|" * len(names)]
    for ctx in CONTEXTS:
        for B in BATCHES:
            n = ctx // 64
            q = torch.randn(B, HQ, D, device=DEV, dtype=torch.bfloat16)
            ip, idx, lpl = i32([b * n for b in range(B + 1)]), torch.arange(B * n, dtype=torch.int32, device=DEV), i32([64] * B)
            kp, _ = make_pages(codec, B * n, 1); vp, _ = make_pages(codec, B * n, 2)
            ws = DecodeWorkspace.allocate(B, HKV, HQ // HKV, D, 64, DEV)
            ms = []
            for bn, w, st in args.tiles:
                K.FORMAT_TILES[key] = {arch: K.Tile(bn, 0, w, st)}
                try: ms.append(bench(lambda: decode(q, kp, vp, ip, idx, lpl, codec, workspace=ws)))
                finally:
                    if saved is None: K.FORMAT_TILES.pop(key)
                    else: K.FORMAT_TILES[key] = saved
            lines.append(f"| {ctx} | {B} | " + " | ".join(f"{x:.3f}" for x in ms) + " |")
            del kp, vp
table = "\n".join(lines)
print(table)
if args.out:
    with open(args.out, "w") as f: f.write(table + "\n")
