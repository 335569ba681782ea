"The `hqkv` command line as a user runs it: the console script and `python -m hqkv.cli`, in a fresh process."
import json, os, subprocess, sys
from pathlib import Path
import pytest

SCRIPT = Path(sys.executable).parent / "hqkv"
ENTRIES = {"module": [sys.executable, "-m", "hqkv.cli"], "script": [str(SCRIPT)]}

def run(entry, *args):
    return subprocess.run([*ENTRIES[entry], *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONHASHSEED": "0"})

@pytest.mark.parametrize("entry", ["module", "script"])
def test_plan_json(entry):
    if entry == "script" and not SCRIPT.exists(): pytest.skip(f"console script not installed at {SCRIPT}")
    r = run(entry, "plan", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    by = {p["kv_format"]: p for p in out["plans"]}
    # seed 000: the 27B's geometry, 9,216 against 65,536 bytes a token; eight lanes at 40,960 tokens
    assert out["model"] == "qwen3.5-27b"
    assert (by["bf16"]["bytes_per_token"], by["hq-e8-2b"]["bytes_per_token"]) == (65_536, 9_216)
    assert round(by["bf16"]["bytes_per_token"] / by["hq-e8-2b"]["bytes_per_token"], 2) == 7.11
    assert round(by["hq-e8-2b"]["need_bytes"] / 1e9, 2) == 3.02
    assert round(by["bf16"]["need_bytes"] / 2**30, 1) == 20.0
    assert by["hq-e8-2b"]["vram_plan"].startswith("hqkv.runtime.vram_plan kv_format=hq-e8-2b page_bytes=589824 ")

def test_plan_table_and_vram_line():
    r = run("module", "plan", "--model", "qwen3-8b", "--format", "bf16,q8_0", "--budget", "24GiB", "--context", "8192")
    assert r.returncode == 0, r.stderr
    assert "hqkv.runtime.vram_plan kv_format=q8_0" in r.stdout
    # seed 003: Qwen3-8B holds 21 requests of 8K in 24 GiB of bf16
    bf16_row = next(l.split() for l in r.stdout.splitlines() if l.startswith("bf16 "))
    assert bf16_row[-1] == "21"

# each case costs a fresh interpreter; the notebook (42_cli) tests the other bad inputs in-process
@pytest.mark.parametrize("args, msg", [
    (["plan", "--format", "fp4-nonsense"], "supported formats"),
    (["plan", "--budget", "12XB"], "accepted forms"),
])
def test_bad_input_exit_2_without_traceback(args, msg):
    r = run("module", *args)
    assert r.returncode == 2
    assert msg in r.stderr
    assert "Traceback" not in r.stderr

@pytest.mark.parametrize("entry", ["module", "script"])
def test_help_lists_every_command(entry):
    "Both entry points see the commands other modules register (`python -m hqkv.cli` once saw only `plan`)."
    if entry == "script" and not SCRIPT.exists(): pytest.skip(f"console script not installed at {SCRIPT}")
    r = run(entry, "--help")
    assert r.returncode == 0, r.stderr
    listed = {l.split()[0] for l in r.stdout.splitlines() if l.startswith("    ") and l.split()}
    for cmd in ("plan", "generate", "demo", "eval", "calibrate"): assert cmd in listed, (cmd, r.stdout)


def test_plan_says_when_the_budget_buys_no_page():
    "`hqkv plan --budget 1` does not just print 0 pages: it says the pool would refuse it, as KVPool does."
    r = run("module", "plan", "--format", "bf16", "--budget", "1")
    assert r.returncode == 0, r.stderr
    assert "bf16: the budget is smaller than one page (4,194,304 bytes): a pool of it is refused" in r.stdout, r.stdout


def test_codec_head_dim_must_be_an_int():
    import pytest as _pytest
    from hqkv.codec import get_codec
    with _pytest.raises(TypeError, match=r"head_dim must be an int, got '256' \(str\)"): get_codec("hq-e8-2b", head_dim="256")
