"""A key profile given as a file works wherever `key_profile=auto` does (issue 32, item 4): `hqkv calibrate --out FILE`
on a tiny random Llama, then every command that takes `--key-profile` runs with that file and says it used it; the same
file given for another model is refused by name, before anything runs. The profile lives only in the file: the cache
directory of each command is empty, so `auto` would find nothing there."""
import json, os, socket, subprocess, sys, time, urllib.request
from pathlib import Path
import pytest

pytest.importorskip("transformers")
CLI = [sys.executable, "-c", "from hqkv.cli import main; raise SystemExit(main())"]
TEXT = Path(__file__).resolve().parents[1] / "hqkv" / "data" / "kjv_excerpt.txt"
SMALL = ["--window-sinks", "4", "--window-recent", "32", "--prefill-chunk", "128", "--budget", "4Ktok", "--context", "1024"]


def run(args, cache, timeout=600):
    env = dict(os.environ, HQKV_CACHE_DIR=str(cache), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    "(tiny model dir, another tiny model dir, the profile file of the first, its tag: what plan lines and reports name it by)."
    from hqkv.models.load import write_tiny_model
    d = tmp_path_factory.mktemp("models")
    tiny, other = write_tiny_model(d / "tiny-llama"), write_tiny_model(d / "other", hidden_size=192, head_dim=64, num_attention_heads=3,
                                                                       num_key_value_heads=1)
    prof = d / "tiny.pt"
    r = run(["calibrate", "--model", str(tiny), "--text-file", str(TEXT), "--tokens", "600", "--chunk", "256", "--out", str(prof)],
            tmp_path_factory.mktemp("calib-cache"))
    assert r.returncode == 0 and prof.exists(), r.stderr
    from hqkv.keyprofile import KeyProfile
    return tiny, other, prof, KeyProfile.load(prof).tag


def test_eval_kld_and_niah_read_the_file(setup, tmp_path):
    tiny, _, prof, tag = setup
    r = run(["eval", "kld", "--model", str(tiny), "--format", "hq-e8-2b", "--key-profile", str(prof), "--text-file", str(TEXT),
             "--context", "512", "--score-last", "128", "--chunk", "128", "--window-sinks", "4", "--window-recent", "32", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["meta"]["key_profile"] == tag and [row["variant"] for row in out["rows"]] == ["hq-e8-2b+profile+window:4:32"], out["meta"]
    r = run(["eval", "niah", "--model", str(tiny), "--format", "hq-e8-2b", "--key-profile", str(prof), "--text-file", str(TEXT),
             "--context", "512", "--depths", "0.5", "--trials", "1", "--no-oracle", "--chunk", "128", "--window-sinks", "4",
             "--window-recent", "32", "--json"], tmp_path)
    # the tiny model's word-level tokenizer cannot spell a pass key: niah resolves the profile (the file) first, then stops at the needle
    assert r.returncode == 2 and "does not spell" in r.stderr and "key profile" not in r.stderr, r.stderr


def test_generate_and_demo_read_the_file(setup, tmp_path):
    tiny, _, prof, tag = setup
    r = run(["generate", "--model", str(tiny), "--format", "hq-e8-2b", "--key-profile", str(prof), "--max-tokens", "4", *SMALL, "In the beginning"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"key_profile={tag} " in r.stdout + r.stderr, r.stdout + r.stderr
    r = run(["demo", "--model", str(tiny), "--key-profile", str(prof), "--max-tokens", "4", "--prompt-tokens", "200", *SMALL], tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"key_profile={tag} " in r.stdout + r.stderr, r.stdout + r.stderr


def test_serve_reads_the_file(setup, tmp_path):
    tiny, _, prof, tag = setup
    with socket.socket() as s: s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    env = dict(os.environ, HQKV_CACHE_DIR=str(tmp_path), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    p = subprocess.Popen(CLI + ["serve", "--model", str(tiny), "--format", "hq-e8-2b", "--key-profile", str(prof), "--port", str(port), *SMALL],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as h: health = h.read().decode()
                break
            except OSError: assert p.poll() is None, p.stdout.read(); time.sleep(0.2)
        else: pytest.fail("hqkv serve did not come up in 120 s")
        body = json.dumps(dict(prompt="In the beginning", max_tokens=3)).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp: assert json.loads(resp.read())["choices"][0]["text"] is not None
    finally:
        p.terminate(); log = p.communicate(timeout=30)[0]
    assert f"key_profile={tag} " in log + health, log[-2000:]


def test_a_file_for_another_model_is_refused_by_name(setup, tmp_path):
    _, other, prof, _ = setup
    for args in (["eval", "kld", "--model", str(other), "--format", "hq-e8-2b", "--text-file", str(TEXT), "--context", "256",
                  "--score-last", "64"],
                 ["generate", "--model", str(other), "--format", "hq-e8-2b", "--max-tokens", "2", "--context", "512", "Hi"]):
        r = run(args + ["--key-profile", str(prof)], tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "was calibrated on tiny-llama@" in r.stderr and "not on this model other@" in r.stderr, r.stderr


def test_a_rotated_profile_file(setup, tmp_path):
    "`hqkv calibrate --rotate` writes a profile with a rotation per (layer, KV head); the engine runs with it."
    tiny, _, _, _ = setup
    prof = tmp_path / "rot.pt"
    r = run(["calibrate", "--model", str(tiny), "--text-file", str(TEXT), "--tokens", "600", "--chunk", "256", "--rotate",
             "--out", str(prof)], tmp_path / "calib")
    assert r.returncode == 0 and prof.exists(), r.stderr
    from hqkv.keyprofile import KeyProfile
    p = KeyProfile.load(prof)
    assert p.rot is not None and tuple(p.rot.shape) == (p.n_layers, p.kv_heads, p.head_dim, p.head_dim)
    r = run(["generate", "--model", str(tiny), "--format", "hq-e8-2b", "--key-profile", str(prof), "--max-tokens", "4", *SMALL,
             "In the beginning"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"key_profile={p.tag} " in r.stdout + r.stderr, r.stdout + r.stderr
