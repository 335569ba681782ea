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
