#!/usr/bin/env python
"""A roofline MODEL of decode attention over pages (not a measurement): predicted time per layer call.

From the decode kernel as it is compiled (`hqkv.kernels.decode.decode_kernel`, tiles from `hqkv.kernels.TILES`): each
program walks its KV head's code blocks (BLOCK_N rows of K and V a step, decoded in registers), then the exact window's
sinks and ring (bf16 rows, BLOCK_N a step), for all G query heads at once (padded to G_PAD = 16 rows for `tl.dot`);
split partials are written and merged. Per call:

- bytes from HBM: code rows (K and V, `row_bytes` each, whole BLOCK_N blocks up to the recent window), the
  window's bf16 rows, the query, the split partials (written, then read by the merge) and the output;
- tensor-core FLOPs: G_PAD x D per row for Q.K (twice: the FP32 query as bf16 hi + lo) and for P.V;
- instructions: the compiled loops' own, counted in the cubin's SASS (`kernels/sass.py`: ptxas' code for the arch,
  disassembled by Triton's nvdisasm): per warp and step of each loop, times the steps and warps of every program, plus
  what runs once per program. Three bounds from them: issue (4 warp-instructions a clock per SM), the integer/logic
  pipe (64 lanes per SM: 2 a clock) and the FP32 pipe (64 lanes per SM on sm_80, 128 on sm_90), which the decode's
  shifts, masks, converts, selects and multiplies load; the special-function unit (`MUFU`, exp) 16 lanes per SM;

predicted time = `LAUNCH_US` + max(bytes / HBM bandwidth, FLOPs / tensor peak, the instruction bounds), with the arch's
datasheet figures below. It is a lower bound: it assumes every latency (global and shared loads, barriers, tensor
cores) hidden by other warps, which a kernel with one 8-warp block per SM (255 registers) cannot do; the first GPU
run (kernels/README.md, H200) measured 4-6x above it from 32K, 10-40x at 4K. A format the kernels do not read
(fp8-e4m3) gets the bytes-only bound, marked as such.

    python kernels/roofline.py    # -> kernels/roofline.md + nbs/results/kernel_roofline.json (28 compiles, ~1 min)
"""
from __future__ import annotations
import functools, json, math, os, subprocess, sys

# Datasheet figures (dense): HBM bytes/s, bf16 tensor FLOP/s, boost clock, SM count, FP32 lanes per SM (sm_80: 64,
# sm_90: 128); every SM issues 4 warp-instructions a clock, has 64 INT32 lanes and 16 special-function lanes.
GPUS = {
    "A100-SXM4-80GB": dict(arch=80, hbm=2.039e12, tensor=312e12, clock=1.41e9, sms=108, fp32_lanes=64),
    "H100-SXM5-80GB": dict(arch=90, hbm=3.35e12, tensor=989e12, clock=1.83e9, sms=132, fp32_lanes=128),
    "H200-SXM-141GB": dict(arch=90, hbm=4.8e12, tensor=989e12, clock=1.83e9, sms=132, fp32_lanes=128),
}
ISSUE_PER_CLOCK, INT_LANES, MUFU_LANES = 4, 64, 16
LAUNCH_US = 5.0            # two launches (split programs + merge) and their tails: an assumption (make gpu-check)
G_PAD = 16                 # query rows per program (tl.dot's minimum)

def spec_for(device_name:str) -> str|None:
    "The GPUS key for a torch device name ('NVIDIA H100 80GB HBM3' -> 'H100-SXM5-80GB'), None when not modelled."
    for k in GPUS:
        if k.split("-")[0] in device_name: return k
    return None

def splits_for(batch, kv_heads, pages, sms):
    "`hqkv.kernels.decode.default_splits` on a GPU with `sms` SMs."
    return max(1, min(64, -(-2 * sms // (batch * kv_heads)), max(1, pages)))

def instruction_us(g:dict, counts:dict, batch:int, kv_heads:int, splits:int, code_rows:int, sinks:int,
                   recent:int) -> dict:
    "The call's instruction bounds (us): issue and each pipe, from `kernels/sass.decode_counts` (per warp and step)."
    bn, heads = counts["block_n"], batch * kv_heads
    steps = dict(code=code_rows // bn, sinks=-(-sinks // bn) if counts["sinks"] else 0,
                 ring=-(-recent // bn) if counts["ring"] else 0)
    def total(p): return counts["warps"] * heads * (splits * counts["once"][p]
                                                     + sum(n * counts[k][p] for k, n in steps.items() if n))
    per_clock = dict(issue=ISSUE_PER_CLOCK, alu=INT_LANES / 32, fma=g["fp32_lanes"] / 32, mufu=MUFU_LANES / 32)
    return {p: total(p) / (r * g["sms"] * g["clock"]) * 1e6 for p, r in per_clock.items()}

@functools.lru_cache(maxsize=None)
def sass_counts(fmt:str, head_dim:int, group:int, arch:int, window:bool) -> dict:
    "`kernels/sass.decode_counts`; in a process of its own under the Triton interpreter (its kernels do not compile)."
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        from sass import decode_counts
        return decode_counts(fmt, head_dim, group, arch, window)
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(filter(None, (os.path.dirname(here), os.environ.get("PYTHONPATH"))))
    cmd = [sys.executable, os.path.join(here, "sass.py"), fmt, str(head_dim), str(group), "--arch", str(arch),
           "--window", "on" if window else "off", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=path))
    if r.returncode: raise RuntimeError(f"{' '.join(cmd[1:])} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])

def predict_decode(gpu:str, fmt:str, head_dim:int, q_heads:int, kv_heads:int, context:int, batch:int,
                   sinks:int=0, recent:int=0, page:int=64, counts:dict|None=None) -> dict:
    "Predicted time (us) of one decode-attention call and its bound (a model; `counts`: the launch's, else compiled)."
    from hqkv.sizing import row_bytes
    from hqkv.kernels import KERNEL_FORMATS
    g, rb = GPUS[gpu], row_bytes(fmt, head_dim)
    D, G, L = head_dim, q_heads // kv_heads, context
    reads, window = fmt in KERNEL_FORMATS, bool(sinks or recent)
    if reads and counts is None: counts = sass_counts(fmt, D, G, g["arch"], window)
    block_n = min(page, counts["block_n"]) if reads else page
    rec_start = max(sinks, L - recent) if window else L
    code_rows = math.ceil(min(rec_start, L) / block_n) * block_n
    win_rows = (min(sinks, L) + min(recent, max(L - sinks, 0))) if window else 0
    splits = splits_for(batch, kv_heads, math.ceil(L / page), g["sms"])
    per_head = 2 * code_rows * rb + 2 * win_rows * 2 * D
    partials = 2 * splits * G * (D + 1) * 4
    nbytes = batch * kv_heads * (per_head + partials) + batch * q_heads * D * 4 * 2
    flops = batch * kv_heads * (code_rows + win_rows) * G_PAD * D * 2 * 3
    t = dict(memory=nbytes / g["hbm"] * 1e6, tensor=flops / g["tensor"] * 1e6)
    if reads: t |= instruction_us(g, counts, batch, kv_heads, splits, code_rows, sinks, recent)
    else: t = dict(memory=t["memory"])
    bound = max(t, key=t.get)
    return dict(gpu=gpu, fmt=fmt, head_dim=D, q_heads=q_heads, kv_heads=kv_heads, context=L, batch=batch,
                sinks=sinks, recent=recent, block_n=block_n, splits=splits, bytes=nbytes, flops=flops,
                us=LAUNCH_US + t[bound], bound=bound, bytes_only=not reads, **{f"{k}_us": v for k, v in t.items()})

MEASURED = "kernels/results.md"     # make gpu-check's table (no window): the model is checked against it

def measured(path=MEASURED) -> tuple[str, dict]:
    "The device of the last `make gpu-check` and its decode rows: (context, batch) -> (hq-e8-2b ms, bf16 ms)."
    if not os.path.exists(path): return "", {}
    lines = open(path).read().splitlines()
    rows = {}
    for line in lines:
        c = [x.strip() for x in line.strip("|").split("|")]
        if len(c) > 4 and c[0] == "decode": rows[int(c[1]), int(c[2])] = (float(c[3]), float(c[4]))
    return lines[0].split(";")[0].removeprefix("Device: "), rows

HEAD_SIZES = (64, 128, 256, 512)      # the widest of each TILES row: hq-e8-2b's decode per head size, at its tile

def table(HQ:int, HKV:int, D:int, fmts:list, counts:dict, rows:list, heads:dict) -> list[str]:
    "roofline.md's lines: the loops' cost per row, the predictions, and the last measurement against them."
    from hqkv.kernels import KERNEL_FORMATS
    read = [f for f in fmts if f in KERNEL_FORMATS]
    def per_row(c): return f"{c['code']['issue'] * c['warps'] / c['block_n']:.0f} ({c['block_n']} rows)"
    lines = ["# Decode attention: a roofline model (predictions, not measurements)", "",
             f"{__doc__.strip().splitlines()[2].strip()} ... (see `kernels/roofline.py`). "
             f"Geometry: {HQ} query heads, "
             f"{HKV} KV heads x {D} (Qwen3.5-27B), one attention layer, pages of 64; window 32 + 512 exact rows or "
             "none. "
             "Predicted microseconds per call; e8/bf16 = hq-e8-2b's time over bf16 pages'; bound: what the model says "
             "limits hq-e8-2b (memory, tensor, issue, alu, fma, mufu); the other formats' times, with what bounds "
             "each in brackets (m: memory, t: tensor, i: issue, a: the integer pipe, f: the FP32 pipe). fp8-e4m3, "
             "which the kernels do not read, gets the bytes-only bound, in brackets.", "",
             "The compiled loops (`kernels/sass.py`): warp-instructions per row of K and V in the code-block loop (a "
             "step's count per warp x warps / BLOCK_N), window off:", "",
             "| arch | " + " | ".join(read) + " |", "|---|" + "---|" * len(read)]
    for a in sorted({g["arch"] for g in GPUS.values()}):
        lines.append(f"| sm_{a} | " + " | ".join(per_row(counts[f"sm_{a} {f} window=off"]) for f in read) + " |")
    lines += ["", f"hq-e8-2b's code-block loop per head size (GQA {HQ // HKV}, window off), warp-instructions a row at "
              "the launcher's tile (`hqkv.kernels.FORMAT_TILES`):", "",
              "| arch | " + " | ".join(map(str, HEAD_SIZES)) + " |", "|---|" + "---|" * len(HEAD_SIZES)]
    for a in sorted({g["arch"] for g in GPUS.values()}):
        lines.append(f"| sm_{a} | " + " | ".join(per_row(heads[f"sm_{a} hq-e8-2b D={d}"]) for d in HEAD_SIZES) + " |")
    lines += ["", "| GPU | context | batch | window | bf16 us | hq-e8-2b us | e8 / bf16 | e8 bound | "
              + " | ".join(fmts[2:]) + " |", "|---|---|---|---|---|---|---|---|" + "---|" * len(fmts[2:])]
    def cell(x): return f"({x['us']:.1f})" if x["bytes_only"] else f"{x['us']:.1f} ({x['bound'][0]})"
    for i in range(0, len(rows), len(fmts)):
        r = {x["fmt"]: x for x in rows[i:i + len(fmts)]}
        b, e = r["bf16"], r["hq-e8-2b"]
        lines.append(f"| {b['gpu']} | {b['context']} | {b['batch']} | {'32+512' if b['recent'] else 'none'} | "
                     f"{b['us']:.1f} | {e['us']:.1f} | {e['us'] / b['us']:.2f} | {e['bound']} | "
                     + " | ".join(cell(r[f]) for f in fmts[2:]) + " |")
    device, meas = measured()
    gpu = spec_for(device)
    if not (meas and gpu): return lines
    lines += ["", f"Against the last measurement (`{MEASURED}`, {device}, predicted as {gpu}; window off): measured "
              "/ predicted time. The kernels of that run are not today's: bf16 decoded 16 rows a step then (64 now), "
              "hq-e8-2b 16 rows x 8 warps with a codeword's values spread over threads (one thread, 32 rows x 4 "
              "warps now).", "", "| context | batch | hq-e8-2b ms measured | predicted | measured / predicted | "
              "bf16 ms measured | predicted | measured / predicted |", "|---|---|---|---|---|---|---|---|"]
    for (ctx, B), (e_ms, b_ms) in sorted(meas.items()):
        p = {x["fmt"]: x["us"] / 1e3 for x in rows
             if x["gpu"] == gpu and x["context"] == ctx and x["batch"] == B and not x["recent"]}
        if p: lines.append(f"| {ctx} | {B} | {e_ms:.3f} | {p['hq-e8-2b']:.3f} | {e_ms / p['hq-e8-2b']:.1f} | "
                           f"{b_ms:.3f} | {p['bf16']:.3f} | {b_ms / p['bf16']:.1f} |")
    return lines

def main():
    from hqkv.codec import list_codecs
    from hqkv.kernels import KERNEL_FORMATS
    from hqkv.sizing import GEOMETRIES
    geo = GEOMETRIES["qwen3.5-27b"]       # the seed's model: 4 KV heads x 256; 24 query heads (bench_attention.py)
    HQ, HKV, D = 24, geo.kv_heads, geo.head_dim
    fmts = ["bf16", "hq-e8-2b"] + [f for f in list_codecs() if f not in ("bf16", "hq-e8-2b")]
    archs = sorted({g["arch"] for g in GPUS.values()})
    counts = {f"sm_{a} {f} window={'on' if w else 'off'}": sass_counts(f, D, HQ // HKV, a, w)
              for a in archs for f in fmts if f in KERNEL_FORMATS for w in (False, True)}
    rows = []
    for gpu, g in GPUS.items():
        for ctx in (4096, 32768, 131072):
            for B in (1, 8, 64):
                for win in ((0, 0), (32, 512)):
                    for f in fmts:
                        c = counts.get(f"sm_{g['arch']} {f} window={'on' if win[1] else 'off'}")
                        rows.append(predict_decode(gpu, f, D, HQ, HKV, ctx, B, *win, counts=c))
    heads = {f"sm_{a} hq-e8-2b D={d}": sass_counts("hq-e8-2b", d, HQ // HKV, a, False)
             for a in archs for d in HEAD_SIZES}
    os.makedirs("nbs/results", exist_ok=True)
    json.dump(dict(model=__doc__.splitlines()[1], launch_us=LAUNCH_US, issue_per_clock=ISSUE_PER_CLOCK,
                   int_lanes=INT_LANES, mufu_lanes=MUFU_LANES, gpus=GPUS, sass_counts=counts, head_sizes=heads,
                   rows=rows), open("nbs/results/kernel_roofline.json", "w"))
    lines = table(HQ, HKV, D, fmts, counts, rows, heads)
    open("kernels/roofline.md", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))

if __name__ == "__main__":
    sys.exit(main())
