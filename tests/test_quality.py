"`hqkv eval` as a user runs it, in a fresh process: a tiny KLD window on the shipped excerpt, and bad input."
import json, math, os, subprocess, sys

def run(*args):
    # `hqkv.cli.main` as the console script calls it (`python -m hqkv.cli` runs the module as __main__, whose
    # command table the command modules do not register into)
    code = "import sys; from hqkv.cli import main; raise SystemExit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONHASHSEED": "0"})

def test_eval_kld_tiny_window():
    r = run("eval", "kld", "--format", "bf16,hq-e8-2b", "--context", "128", "--chunk", "64", "--score-last", "64",
            "--text", "kjv-excerpt", "--window-sinks", "0", "--window-recent", "0", "--bit-plan", "off", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    by = {row["variant"]: row for row in out["rows"]}
    assert set(by) == {"bf16", "hq-e8-2b+profile"}               # auto: the shipped profile for the rotated format only (its bit plan off)
    assert abs(by["bf16"]["kld"]["128"]) < 1e-5                   # bf16 pages = the oracle's bf16 K/V
    kld = by["hq-e8-2b+profile"]["kld"]["128"]
    assert 0 < kld < math.inf
    assert by["hq-e8-2b+profile"]["bytes_per_token"] == 432 and out["meta"]["text"] == "kjv-excerpt"
    assert len(out["records"]) == 2 and all(rec["n"] == 64 for rec in out["records"])

def test_eval_bad_input():
    for args, msg in ((["eval", "kld", "--text-file", "/nonexistent.txt"], "no text file"),
                      (["eval", "niah", "--format", "fp4", "--text", "kjv-excerpt", "--context", "160"], "supported formats")):
        r = run(*args)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
