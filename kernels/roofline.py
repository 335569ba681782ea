#!/usr/bin/env python
"""A roofline MODEL of decode attention over pages (not a measurement): predicted time per layer call.

From the decode kernel's own loop structure (`hqkv.kernels.decode`, tiles from `hqkv.kernels.TILES`): each program
walks its KV head's code blocks (BLOCK_N rows of K and V, decoded in registers), then the exact window's rows, for
all G query heads at once (padded to G_PAD = 16 rows for `tl.dot`); split partials are written and merged. Per call:

- bytes from HBM: code rows (K and V, `row_bytes` each, whole BLOCK_N blocks up to the recent window), the
  window's bf16 rows, the query, the split partials (written, then read by the merge) and the output;
- tensor-core FLOPs: G_PAD x D per row for Q.K (twice: the FP32 query as bf16 hi + lo) and for P.V;
- ALU operations: the in-register decode (`E8_OPS_PER_VALUE` per coordinate of K and V, counted from `_load_rows`;
  the byte formats' `BYTE_OPS_PER_VALUE` from `_load_blocks`, whose tbq scales are applied by a select per block of
  the row, `SCALE_OPS_PER_BLOCK` each, and whose ggml values each read their block's scale) and the online softmax (`SOFTMAX_OPS_PER_SCORE` per score);

predicted time = `LAUNCH_US` + max(bytes / HBM bandwidth, FLOPs / tensor peak, ops / ALU peak), with the arch's
datasheet peaks below (real kernels reach 70-90% of them). A format the kernels do not read (fp8-e4m3) gets the
bytes-only bound (its decode cost is unknown), marked as such.

    python kernels/roofline.py    # -> kernels/roofline.md + nbs/results/kernel_roofline.json
"""
from __future__ import annotations
import json, math, os, sys

# Datasheet peaks (dense): HBM bytes/s, bf16 tensor FLOP/s, 32-bit ALU op/s (the decode mixes integer shifts and masks
# with float converts, selects and multiplies: FP32 + INT32 lanes per SM per clock, 64 + 64 on sm_80, 128 + 64 on
# sm_90, at the boost clock), SM count.
GPUS = {
    "A100-SXM4-80GB": dict(arch=80, hbm=2.039e12, tensor=312e12, alu=128 * 108 * 1.41e9, sms=108),
    "H100-SXM5-80GB": dict(arch=90, hbm=3.35e12, tensor=989e12, alu=192 * 132 * 1.83e9, sms=132),
    "H200-SXM-141GB": dict(arch=90, hbm=4.8e12, tensor=989e12, alu=192 * 132 * 1.83e9, sms=132),
}
LAUNCH_US = 5.0            # two launches (split programs + merge) and their tails: an assumption, checked by make gpu-check
E8_OPS_PER_VALUE = 13      # per coordinate: 2 shifts, 2 ands, int->float, +0.5, compare, select, +shift, *scale, ->bf16, + the group's share
# per value: address, byte -> int, unpack (shifts/masks or nibble select), int -> float or centroid lookup, -> bf16;
# ggml also its scale: two bytes -> int, shift, or, fp16 -> fp32, multiply
BYTE_OPS_PER_VALUE = {"q8_0": 12, "q4_0": 15, "tbq2": 9, "tbq4": 9, "tbq3": 13}
SCALE_OPS_PER_BLOCK = 3    # tbq: per value and per block of its row, compare the block index, multiply, select
SOFTMAX_OPS_PER_SCORE = 8  # mask, max, subtract, exp, sum, and the rescale's share
G_PAD = 16                 # query rows per program (tl.dot's minimum)

def spec_for(device_name:str) -> str|None:
    "The GPUS key for a torch device name ('NVIDIA H100 80GB HBM3' -> 'H100-SXM5-80GB'), None when not modelled."
    for k in GPUS:
        if k.split("-")[0] in device_name: return k
    return None

def splits_for(batch, kv_heads, pages, sms):
    "`hqkv.kernels.decode.default_splits` on a GPU with `sms` SMs."
    return max(1, min(64, -(-2 * sms // (batch * kv_heads)), max(1, pages)))

def blocks_per_row(fmt:str, head_dim:int) -> int:
    "Blocks (one fp16 scale each) in a row of a byte format: tbq's `tbq_block`, ggml's 32 values."
    from hqkv.codec.tbq import tbq_block
    return head_dim // (32 if fmt.startswith("q") else tbq_block(head_dim))

def predict_decode(gpu:str, fmt:str, head_dim:int, q_heads:int, kv_heads:int, context:int, batch:int,
                   sinks:int=0, recent:int=0, page:int=64) -> dict:
    "Predicted time (us) of one decode-attention call and what bounds it (a model)."
    from hqkv.sizing import row_bytes
    from hqkv.kernels import KERNEL_FORMATS, arch_tile
    g, rb = GPUS[gpu], row_bytes(fmt, head_dim)
    D, G, L = head_dim, q_heads // kv_heads, context
    block_n = min(page, arch_tile("decode", D, g["arch"], fmt).block_n)   # the launcher's tile, for that GPU
    rec_start = max(sinks, L - recent) if (sinks or recent) else L
    code_rows = math.ceil(min(rec_start, L) / block_n) * block_n
    win_rows = (min(sinks, L) + min(recent, max(L - sinks, 0))) if (sinks or recent) else 0
    splits = splits_for(batch, kv_heads, math.ceil(L / page), g["sms"])
    per_head = 2 * code_rows * rb + 2 * win_rows * 2 * D
    partials = 2 * splits * G * (D + 1) * 4
    nbytes = batch * kv_heads * (per_head + partials) + batch * q_heads * D * 4 * 2
    rows = code_rows + win_rows
    flops = batch * kv_heads * rows * G_PAD * D * 2 * 3
    reads = fmt in KERNEL_FORMATS
    ops = batch * kv_heads * rows * G_PAD * SOFTMAX_OPS_PER_SCORE
    if fmt == "hq-e8-2b": ops += batch * kv_heads * code_rows * 2 * D * E8_OPS_PER_VALUE
    elif fmt in BYTE_OPS_PER_VALUE: ops += batch * kv_heads * code_rows * 2 * D * (BYTE_OPS_PER_VALUE[fmt] + (0 if fmt.startswith("q") else SCALE_OPS_PER_BLOCK * blocks_per_row(fmt, D)))
    t = dict(memory=nbytes / g["hbm"] * 1e6, tensor=flops / g["tensor"] * 1e6, alu=ops / g["alu"] * 1e6)
    if not reads: t = dict(memory=t["memory"])
    bound = max(t, key=t.get)
    return dict(gpu=gpu, fmt=fmt, head_dim=D, q_heads=q_heads, kv_heads=kv_heads, context=L, batch=batch, sinks=sinks, recent=recent,
                block_n=block_n, splits=splits, bytes=nbytes, flops=flops, ops=ops, us=LAUNCH_US + t[bound], bound=bound,
                bytes_only=not reads, **{f"{k}_us": v for k, v in t.items()})

def main():
    from hqkv.codec import list_codecs
    from hqkv.sizing import GEOMETRIES
    geo = GEOMETRIES["qwen3.5-27b"]                  # the seed's model: 4 KV heads x 256; 24 query heads as in kernels/bench_attention.py
    HQ, HKV, D = 24, geo.kv_heads, geo.head_dim
    fmts = ["bf16", "hq-e8-2b"] + [f for f in list_codecs() if f not in ("bf16", "hq-e8-2b")]
    rows = []
    for gpu in GPUS:
        for ctx in (4096, 32768, 131072):
            for B in (1, 64):
                for win in ((0, 0), (32, 512)):
                    for f in fmts: rows.append(predict_decode(gpu, f, D, HQ, HKV, ctx, B, *win))
    os.makedirs("nbs/results", exist_ok=True)
    json.dump(dict(model=__doc__.splitlines()[1], launch_us=LAUNCH_US, e8_ops_per_value=E8_OPS_PER_VALUE,
                   byte_ops_per_value=BYTE_OPS_PER_VALUE, scale_ops_per_block=SCALE_OPS_PER_BLOCK, gpus=GPUS, rows=rows),
              open("nbs/results/kernel_roofline.json", "w"))
    lines = ["# Decode attention: a roofline model (predictions, not measurements)", "",
             f"{__doc__.strip().splitlines()[2].strip()} ... (see `kernels/roofline.py`). Geometry: {HQ} query heads, {HKV} KV heads x {D} "
             f"(Qwen3.5-27B), one attention layer, pages of 64; window 32 + 512 exact rows or none. Predicted microseconds per call; "
             f"e8/bf16 = hq-e8-2b's time over bf16 pages'; bound: what the model says limits hq-e8-2b; the other formats' "
             "times, with what bounds each in brackets (m: memory, a: ALU, t: tensor). fp8-e4m3, which the kernels do not read, "
             "gets the bytes-only bound, in brackets.", "",
             "| GPU | context | batch | window | bf16 us | hq-e8-2b us | e8 / bf16 | e8 bound | " + " | ".join(f for f in fmts[2:]) + " |",
             "|---|---|---|---|---|---|---|---|" + "---|" * len(fmts[2:])]
    cell = lambda x: f"({x['us']:.1f})" if x["bytes_only"] else f"{x['us']:.1f} ({x['bound'][0]})"
    for i in range(0, len(rows), len(fmts)):
        r = {x["fmt"]: x for x in rows[i:i + len(fmts)]}
        b, e = r["bf16"], r["hq-e8-2b"]
        lines.append(f"| {b['gpu']} | {b['context']} | {b['batch']} | {'32+512' if b['recent'] else 'none'} | {b['us']:.1f} | {e['us']:.1f} | "
                     f"{e['us'] / b['us']:.2f} | {e['bound']} | " + " | ".join(cell(r[f]) for f in fmts[2:]) + " |")
    open("kernels/roofline.md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))

if __name__ == "__main__":
    sys.exit(main())
