#!/usr/bin/env python
"""A probe for issue 31: hq-e8-2b's decode on bytes packed four to a register, compiled and counted, never run.

`kernels/e8_packed_decode.md` describes it. Here: `emulate` checks its byte arithmetic against the codebook for every
codeword (plain Python, any machine); `_load_e8_packed` is the Triton decode with its inline PTX; `main` puts it in
place of `hqkv.kernels.decode._load_e8` in this process only, compiles the engine's decode launches (the launcher's
tiles, GQA 6, window off, as `kernels/roofline.md`'s per-head-size table) for sm_80 and sm_90, counts their code-block
loop (`kernels/sass.py`) beside today's (`nbs/results/kernel_roofline.json`), checks registers and spills
(`compile_check`), runs the roofline model on those counts, and writes `kernels/e8_packed_decode.json`. The kernels of
the package do not change: the Triton interpreter the tests use cannot execute inline PTX, and no GPU has run this
decode.

    TRITON_INTERPRET=0 python kernels/e8_packed_probe.py        # ~1 minute, no GPU
"""
import json, os, sys
import triton
import triton.language as tl

PTX = tl.constexpr("""{
    .reg .b32 ml, mh, sl, sh, pl, ph, nl, nh, ul, uh, t0, t1, t2, t3, one, c144, nz, ex;
    mov.b64 {ml, mh}, $8; mov.b64 {sl, sh}, $9;
    mov.b32 one, 0x3F803F80; mov.b32 c144, 0xC310C310; mov.b32 nz, 0x80008000; mov.b32 ex, 0x43434343;
    and.b32 mh, mh, 0x7F7F7F7F;
    add.u32 pl, ml, $10; add.u32 ph, mh, $10;
    sub.u32 nl, $10, ml; sub.u32 nh, $10, mh;
    lop3.b32 ul, nl, pl, sl, 0xCA; lop3.b32 uh, nh, ph, sh, 0xCA;
    prmt.b32 t0, ul, ex, 0x4140; prmt.b32 t1, ul, ex, 0x4342;
    prmt.b32 t2, uh, ex, 0x4140; prmt.b32 t3, uh, ex, 0x4342;
    fma.rn.bf16x2 t0, t0, one, c144; fma.rn.bf16x2 t1, t1, one, c144;
    fma.rn.bf16x2 t2, t2, one, c144; fma.rn.bf16x2 t3, t3, one, c144;
    fma.rn.bf16x2 t0, t0, $11, nz; fma.rn.bf16x2 t1, t1, $11, nz;
    fma.rn.bf16x2 t2, t2, $11, nz; fma.rn.bf16x2 t3, t3, $11, nz;
    mov.b32 {$0, $1}, t0; mov.b32 {$2, $3}, t1; mov.b32 {$4, $5}, t2; mov.b32 {$6, $7}, t3;
}""")
# u = 16 + 4x per byte: K - m where the sign byte is 0xFF, m + K elsewhere (LOP3 0xCA: c ? a : b); PRMT puts two bytes
# under the bf16 exponent of 128 (0x43): bf16(128 + u); the first HFMA2 takes 144 off (exact), the second scale / 4

@triton.jit
def _load_e8_packed(rows, n_mask, table_ptr, D, NS: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr):
    "`_load_e8` on packed bytes; table_ptr read as int64: [0, 256) magnitudes (parity in bit 63), [256, 512) signs."
    offs_g = tl.arange(0, D_PAD // 8)
    ok = n_mask[:, None] & (offs_g < D // 8)[None, :]
    code = tl.load(rows + offs_g[None, :], mask=ok, other=0).to(tl.int32) & 0xFFFF
    s16 = tl.load(rows + D // 8 + (offs_g * NS // (D // 8))[None, :], mask=ok, other=0)
    s4 = (s16.to(tl.int32) & 0xFFFF) - 0x100                # scale / 4 as bf16 bits, in both halves
    s4x2 = s4 | (s4 << 16)
    t64 = table_ptr.to(tl.pointer_type(tl.int64))
    mag = tl.load(t64 + (code >> 8))
    sgn = tl.load(t64 + 256 + ((code & 0xFE) | (mag >> 63).to(tl.int32) & 1))
    K = 0x0F0F0F0F + (code & 1) * 0x02020202
    c0, c1, c2, c3, c4, c5, c6, c7 = tl.inline_asm_elementwise(
        PTX, "=h,=h,=h,=h,=h,=h,=h,=h,l,l,r,r", [mag, sgn, K, s4x2], dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    x = tl.join(tl.join(tl.join(c0, c4), tl.join(c2, c6)), tl.join(tl.join(c1, c5), tl.join(c3, c7)))
    return tl.reshape(x, [BLOCK_N, D_PAD])

def tables():
    "(magnitude words [256], sign words [256]) as the PTX reads them: 4|p| bytes with the parity in bit 63; 0xFF bytes."
    from hqkv.codec.e8 import E8P_ABS, E8P_PARITY
    m, par = (E8P_ABS * 4).round().long().tolist(), E8P_PARITY.tolist()
    mag = [sum(m[p][t] << (8 * t) for t in range(8)) | (par[p] << 63) for p in range(256)]
    sgn = []
    for idx in range(256):   # bits 1..7 the signs of coordinates 1..7, bit 0 the pattern's parity: coordinate 0's rule
        bits = [(idx >> t) & 1 for t in range(1, 8)]
        neg = [(sum(bits) + (idx & 1)) & 1] + bits
        sgn.append(sum(0xFF << (8 * t) for t in range(8) if neg[t]))
    return mag, sgn

def emulate(tabs:tuple|None=None) -> int:
    "The PTX's byte arithmetic on every codeword against `e8p_grid()` x 4 (`tabs`: default `tables()`): how many wrong."
    from hqkv.codec.e8 import e8p_grid
    grid4, (mag, sgn), bad = (e8p_grid() * 4).round().long().tolist(), tabs or tables(), 0
    for c in range(65536):
        mw, K = mag[c >> 8], 0x11111111 if c & 1 else 0x0F0F0F0F
        sw = sgn[(c & 0xFE) | (mw >> 63)]
        u = []
        for h in range(2):
            m, s = (mw >> 32 * h) & 0x7F7F7F7F, (sw >> 32 * h) & 0xFFFFFFFF
            w = ((K - m) & s) | ((m + K) & ~s & 0xFFFFFFFF)
            u += [(w >> 8 * k) & 0xFF for k in range(4)]
        bad += [x - 16 for x in u] != grid4[c]
    return bad

def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import compile_check as cc, roofline, sass
    from hqkv.kernels import decode as dec
    bad = emulate()
    print(f"byte arithmetic: {bad} of 65,536 codewords wrong")
    saved = json.load(open("nbs/results/kernel_roofline.json"))   # today's counts, as kernels/roofline.py saved them
    today = {(a, d): saved["head_sizes"][f"sm_{a} hq-e8-2b D={d}"] for a in (80, 90) for d in roofline.HEAD_SIZES}
    bf16 = {(a, w): saved["sass_counts"][f"sm_{a} bf16 window={('off', 'on')[w]}"] for a in (80, 90) for w in (0, 1)}
    dec._load_e8 = _load_e8_packed                       # this process only, before anything compiles
    packed = {(a, d): sass.decode_counts("hq-e8-2b", d, 6, a, False) for a in (80, 90) for d in roofline.HEAD_SIZES}
    packed_win = {a: sass.decode_counts("hq-e8-2b", 256, 6, a, True) for a in (80, 90)}
    def per_row(c): return c["code"]["issue"] * c["warps"] / c["block_n"]
    heads, res = [], []
    for (a, d), c in packed.items():
        cfg = cc.Config("engine", "decode", "hq-e8-2b", d, 6, False)
        with cc.recording(a) as sink: cc.call(cfg)
        r = next(cc.compile_one(*cc.launch_key(x, a)[1]) for x in sink if x.fn.__name__ == "decode_kernel")
        heads.append(dict(arch=a, head_dim=d, today=round(per_row(today[a, d]), 1), packed=round(per_row(c), 1),
                          registers=r.registers, spill_stores=r.spill_stores, shared=r.shared))
        print(heads[-1])
    for gpu, g in roofline.GPUS.items():
        for ctx in (4096, 32768, 131072):
            for B in (1, 8, 64):
                for win in ((0, 0), (32, 512)):
                    on = bool(win[1])
                    b = roofline.predict_decode(gpu, "bf16", 256, 24, 4, ctx, B, *win, counts=bf16[g["arch"], int(on)])
                    e = roofline.predict_decode(gpu, "hq-e8-2b", 256, 24, 4, ctx, B, *win,
                                                counts=packed_win[g["arch"]] if on else packed[g["arch"], 256])
                    res.append(dict(gpu=gpu, context=ctx, batch=B, window=on, bf16_us=round(b["us"], 2),
                                    packed_us=round(e["us"], 2), ratio=round(e["us"] / b["us"], 3), bound=e["bound"]))
    h100 = [r["ratio"] for r in res if r["gpu"].startswith("H100")]
    at32 = [r["ratio"] for r in res if r["gpu"].startswith("H100") and r["context"] == 32768 and r["batch"] == 1]
    print(f"H100, packed hq-e8-2b / bf16 pages: {min(h100):.2f}-{max(h100):.2f}; 32K, batch 1: {at32}")
    json.dump(dict(probe=__doc__.splitlines()[1], emulated_wrong=bad, geometry="24 query heads, 4 KV heads x 256",
                   head_sizes=heads, predictions=res), open("kernels/e8_packed_decode.json", "w"), indent=1)

if __name__ == "__main__":
    sys.exit(main())
