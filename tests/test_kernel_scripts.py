"The GPU scripts in kernels/ keep working: their --tiny mode runs under the Triton interpreter (or on a GPU when there is one)."
import os, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]

@pytest.mark.parametrize("script", ["check_attention.py", "bench_attention.py"])
def test_script_tiny(script, tmp_path):
    env = dict(os.environ, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"), OMP_NUM_THREADS="1")
    extra = ["--out", str(tmp_path / "table.md")] if script.startswith("bench") else []
    r = subprocess.run([sys.executable, str(ROOT / "kernels" / script), "--tiny", *extra], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    if script.startswith("check"):
        assert "0 failure(s)" in r.stdout and "FAIL" not in r.stdout, r.stdout
    else:
        table = (tmp_path / "table.md").read_text()
        assert "| decode |" in table and "| prefill" in table, table

SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   LOP3.LUT R2, R2, 0x3, RZ, 0xc0, !PT ;
.L_x_2:
        /*0020*/                   FADD R3, R3, 0.5 ;
        /*0030*/               @P0 BRA `(.L_x_2) ;
        /*0040*/                   NOP ;
        /*0050*/              @!P1 BRA `(.L_x_1) ;
        /*0060*/                   MUFU.EX2 R4, R4 ;
.L_x_3:
        /*0070*/                   IMAD R5, R5, 0x2, RZ ;
        /*0080*/                   BRA `(.L_x_3) ;
        /*0090*/                   EXIT ;
.L_x_4:
        /*00a0*/                   BRA `(.L_x_4);
"""

def test_sass_loops():
    """kernels/sass.py: the top-level loops in program order (a nested loop inside its parent's count), the trap after
    EXIT no loop, NOP no issued work."""
    sys.path.insert(0, str(ROOT / "kernels"))
    import sass                                   # reading SASS imports neither triton nor compile_check
    assert "compile_check" not in sys.modules or os.environ.get("TRITON_INTERPRET") != "0"   # no side effect
    body, rest = sass.loops(SASS)
    assert [sum(c.values()) for c in body] == [5, 2], body          # .L_x_1 to its branch (.L_x_2 inside), .L_x_3
    assert body[0]["FADD"] == 1 and body[0]["BRA"] == 2 and body[1]["IMAD"] == 1
    assert rest == {"LDC": 1, "MUFU": 1, "EXIT": 1, "BRA": 1}, rest
    p = sass.pipes(body[0])
    assert p == dict(issue=4, alu=1, fma=1, mufu=0), p                # NOP: padding, not issued work
    assert sass.pipes(rest)["mufu"] == 1


def test_e8_packed_emulation():
    "kernels/e8_packed_probe.py: its byte arithmetic gives every codeword's values; a wrong table entry is caught."
    sys.path.insert(0, str(ROOT / "kernels"))
    import e8_packed_probe as p
    assert p.emulate() == 0
    mag, sgn = p.tables()
    sgn = list(sgn); sgn[3] ^= 0xFF                      # coordinate 0's sign wrong for one sign index
    assert p.emulate((mag, sgn)) > 0
