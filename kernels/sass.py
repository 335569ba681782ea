#!/usr/bin/env python
"""What a decode launch's loops cost in machine instructions: the compiled kernel's SASS, counted (no GPU needed).

`compile_check` records the launch the engine makes for a configuration and compiles it for an arch (its signature,
constexprs, tile and `num_warps` are the launcher's own); here the cubin is disassembled with the `nvdisasm` Triton
ships, and the instructions of each top-level loop (a backward branch to a label before it) are counted by opcode.
`hqkv.kernels.decode.decode_kernel` has one loop over its code blocks (`BLOCK_N` rows of K and V a step), then, with the
exact window, one over the sinks and one over the recent ring (bf16 rows, `BLOCK_N` a step); what is outside the loops
runs once per program. A count is per warp: every warp of the program issues each instruction once per step.

    python kernels/sass.py hq-e8-2b 256 6 --arch 90       # one configuration's loops, opcode by opcode
    python kernels/sass.py bf16 256 6 --arch 80 --window off
    python kernels/sass.py bf16 256 6 --json              # the counts kernels/roofline.py reads

`kernels/roofline.py` turns these counts into issue and pipe bounds (its model of the ALU side of a call).
"""
from __future__ import annotations
import argparse, collections, functools, json, os, re, subprocess, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# compile_check (which sets TRITON_INTERPRET=0 before triton is imported) loads only where a kernel is compiled:
# reading SASS (`loops`, `pipes`) imports nothing

# Which execution pipe an opcode issues to on sm_80/sm_90 (NVIDIA's tuning guides and public microbenchmarks; an
# opcode not named here counts toward issue only): "alu" the integer and logic pipe (16 lanes per SM sub-partition),
# "fma" the FP32 pipe (16 lanes per sub-partition on sm_80, 32 on sm_90), "mufu" the special-function unit (4 lanes)
PIPES = {
    "alu": ("LOP3", "SHF", "IADD3", "ISETP", "PRMT", "LEA", "SEL", "FSEL", "FSETP", "IABS", "FMNMX", "IMNMX", "VIADD",
            "LOP", "SGXT", "BMSK", "POPC", "FLO", "VIMNMX", "HSETP2"),
    "fma": ("FADD", "FMUL", "FFMA", "IMAD", "HADD2", "HMUL2", "HFMA2", "I2FP", "F2FP", "FCHK"),
    "mufu": ("MUFU",),
}
PIPE_OF = {op: p for p, ops in PIPES.items() for op in ops}

_INS = re.compile(r"\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BACK = re.compile(r"BRA\s+`\((\.L_x_\d+)\)")

def disassemble(cfg, arch:int, kernel:str="decode_kernel") -> tuple[str, dict, int]:
    "(SASS text, the launch's named constexprs, num_warps) of `kernel` as the launcher calls it for `cfg` on `arch`."
    import compile_check as cc
    import triton
    from triton.compiler import ASTSource
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with cc.recording(arch) as sink: cc.call(cfg)
    for launch in sink:
        if launch.fn.__name__ != kernel: continue
        _, (target, fn, sig, cx, attrs, options, named) = cc.launch_key(launch, arch)
        k = triton.compile(ASTSource(fn, sig, cx, attrs), target=target, options=options.__dict__)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "k.cubin")
            open(path, "wb").write(k.asm["cubin"])
            r = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True)
        if r.returncode: raise RuntimeError(f"nvdisasm failed on {cfg.label()} sm_{arch}: {r.stderr[-500:]}")
        return r.stdout, dict(named), options.num_warps
    raise RuntimeError(f"{cfg.label()} made no {kernel} launch")

def loops(sass:str) -> tuple[list[collections.Counter], collections.Counter]:
    "The top-level loops' opcode counts (program order) and the count of everything outside them."
    ins, labels = [], {}
    for line in sass.splitlines():
        if m := _LABEL.match(line): labels[m.group(1)] = len(ins)
        elif m := _INS.match(line): ins.append((m.group(2), line))
    spans = []
    for i, (_, line) in enumerate(ins):
        m = _BACK.search(line)             # a branch back; not the trap after EXIT (a BRA to itself)
        if m and labels.get(m.group(1), i) < i: spans.append((labels[m.group(1)], i))
    top = [s for s in spans if not any(o != s and o[0] <= s[0] and s[1] <= o[1] for o in spans)]
    count = lambda a, b: collections.Counter(op for op, _ in ins[a:b + 1])
    inside = set(i for a, b in top for i in range(a, b + 1))
    rest = collections.Counter(op for i, (op, _) in enumerate(ins) if i not in inside)
    return [count(a, b) for a, b in sorted(top)], rest

def pipes(c:collections.Counter) -> dict:
    "Instructions per pipe (and 'issue': all of them) of an opcode count."
    out = dict(issue=sum(n for op, n in c.items() if op != "NOP"), alu=0, fma=0, mufu=0)   # NOP: alignment
    for op, n in c.items():
        if op in PIPE_OF: out[PIPE_OF[op]] += n
    return out

def decode_loops(fmt:str, head_dim:int, group:int, arch:int, window:bool) -> tuple:
    "The decode launch's top-level loops' opcode counts (code blocks, sinks, ring), the rest, its constexprs, warps."
    from compile_check import Config
    sass, named, warps = disassemble(Config("engine", "decode", fmt, head_dim, group, window), arch)
    body, outside = loops(sass)
    if len(body) != (3 if window else 1):
        raise RuntimeError(f"decode_kernel {fmt} D={head_dim} G={group} window={window} sm_{arch}: {len(body)} "
                           f"top-level loops, expected {3 if window else 1} (the kernel's loop structure changed: "
                           "update kernels/sass.py)")
    return body, outside, named, warps

@functools.lru_cache(maxsize=None)
def decode_counts(fmt:str, head_dim:int, group:int, arch:int, window:bool) -> dict:
    "The decode launch's tile and its loops' instructions per pipe and warp: code step, window steps, once a program."
    body, outside, named, warps = decode_loops(fmt, head_dim, group, arch, window)
    return dict(block_n=named["BLOCK_N"], warps=warps, code=pipes(body[0]), once=pipes(outside),
                sinks=pipes(body[1]) if window else None, ring=pipes(body[2]) if window else None)

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("format"); ap.add_argument("head_dim", type=int); ap.add_argument("group", type=int)
    ap.add_argument("--arch", type=int, default=90); ap.add_argument("--window", choices=("on", "off"), default="on")
    ap.add_argument("--json", action="store_true", help="print decode_counts as JSON (what kernels/roofline.py reads)")
    a = ap.parse_args(argv)
    win = a.window == "on"
    if a.json: return print(json.dumps(decode_counts(a.format, a.head_dim, a.group, a.arch, win)))
    body, outside, named, warps = decode_loops(a.format, a.head_dim, a.group, a.arch, win)
    print(f"decode_kernel {a.format} D={a.head_dim} G={a.group} window={a.window} sm_{a.arch}: "
          f"BLOCK_N={named['BLOCK_N']}, {warps} warps")
    for name, c in zip(("code blocks", "sinks", "ring") if win else ("code blocks",), body):
        p = pipes(c)
        per_row = p["issue"] * warps / named["BLOCK_N"]
        print(f"  {name}: {p['issue']} instructions a step per warp ({per_row:.1f} per row for the program), "
              f"alu {p['alu']}, fma {p['fma']}, mufu {p['mufu']}")
        print("    " + ", ".join(f"{op} {n}" for op, n in c.most_common()))
    print(f"  outside the loops: {sum(outside.values())}")

if __name__ == "__main__":
    sys.exit(main())
