"""Any transformers model end to end through the CLI: `hqkv calibrate --model DIR|NAME` writes a profile where
`key_profile="auto"` finds it, `hqkv eval kld --model ...` measures through `HQKVCache`, and bad models are refused
with nothing written. A tiny random Llama on disk runs offline; the real SmolLM2-135M is fetched from its pip
package (skipped, with the reason, when the registry cannot be reached)."""
import json, os, subprocess, sys
from pathlib import Path
import pytest

pytest.importorskip("transformers")
CLI = [sys.executable, "-c", "from hqkv.cli import main; raise SystemExit(main())"]
TEXT = Path(__file__).resolve().parents[1] / "hqkv" / "data" / "kjv_excerpt.txt"


def run(args, cache, timeout=600):
    env = dict(os.environ, HQKV_CACHE_DIR=str(cache), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout, env=env)


def seed_cache(cache, name):
    """Link the default cache's copy of packaged model `name` and its transformers conversion into the empty cache
    `cache`: fetched and converted once per machine (as every load does) instead of once per test (~20 s of CPU)."""
    from hqkv.models.load import fetch_model, _from_gguf
    g = fetch_model(name)
    conv = _from_gguf(g.parent, g.name, name)
    (cache / "models" / "converted").mkdir(parents=True)
    (cache / "models" / name).symlink_to(g.parent)
    (cache / "models" / "converted" / conv.name).symlink_to(conv)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from hqkv.models.load import write_tiny_model
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


def test_calibrate_a_directory_then_auto_finds_it(tiny, tmp_path):
    r = run(["calibrate", "--model", str(tiny), "--text-file", str(TEXT), "--tokens", "600", "--chunk", "256", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert Path(rep["out"]).parent == tmp_path / "profiles" and rep["layers"] == [0, 1] and rep["model"]["kind"] == "transformers"
    code = ("from hqkv.models.load import load_causal_lm; from hqkv.hf import HQKVCache; "
            f"lm = load_causal_lm({str(tiny)!r}); c = HQKVCache(lm.model, 'hq-e8-2b'); "
            "assert c.key_profile is not None and c.key_profile.n_tokens == 600, c")
    env = dict(os.environ, HQKV_CACHE_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr


def test_eval_kld_on_a_directory(tiny, tmp_path):
    r = run(["eval", "kld", "--model", str(tiny), "--format", "hq-e8-2b,tbq2", "--key-profile", "off", "--text-file", str(TEXT),
             "--context", "512", "--score-last", "128", "--chunk", "128", "--window-sinks", "4", "--window-recent", "32", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = {row["variant"]: row for row in out["rows"]}
    assert set(rows) == {"hq-e8-2b+window:4:32", "tbq2+window:4:32"}, rows
    assert rows["hq-e8-2b+window:4:32"]["bytes_per_token"] == 2 * 2 * 1 * 18     # K and V x 2 layers x 1 KV head x 18 B (D = 64)
    assert all(r["kld"]["512"] >= 0 for r in rows.values()), rows


def test_bad_models_are_refused_and_nothing_is_written(tmp_path):
    from hqkv.models.load import write_tiny_model
    slid = write_tiny_model(tmp_path / "all-sliding", layer_types=["sliding_attention"] * 2, sliding_window=64)
    odd = write_tiny_model(tmp_path / "head72", hidden_size=144, head_dim=72)
    for model, msg in ((slid, "no full-attention layers"), (tmp_path / "nothing-here", "is not the bundled model")):
        r = run(["calibrate", "--model", str(model), "--text-file", str(TEXT), "--tokens", "300"], tmp_path / "cache")
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = run(["eval", "kld", "--model", str(odd), "--format", "hq-e8-2b", "--key-profile", "off", "--text-file", str(TEXT),
             "--context", "256", "--score-last", "64"], tmp_path / "cache")
    assert r.returncode == 2 and "head_dim 72 is not supported" in r.stderr, r.stderr
    assert not (tmp_path / "cache" / "profiles").exists() or not any((tmp_path / "cache" / "profiles").iterdir())


@pytest.mark.model
def test_real_smollm2_calibrate_and_eval(tmp_path):
    """SmolLM2-135M (llama, 30 layers, 3 KV heads x 64) from its pip package: a profile on 512 tokens of the Python
    docs, then hq-e8-2b with it on one 512-token window of KJV Genesis (the shipped excerpt), and a needle at 512."""
    from hqkv.models.load import fetch_model, ModelUnavailable
    try: fetch_model("smollm2-135m")
    except ModelUnavailable as e: pytest.skip(str(e))
    seed_cache(tmp_path, "smollm2-135m")
    from hqkv.keyprofile import CALIB_TEXT
    r = run(["calibrate", "--model", "smollm2-135m", "--text-file", str(CALIB_TEXT), "--tokens", "512", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["layers"] == list(range(30))
    r = run(["eval", "kld", "--model", "smollm2-135m", "--format", "hq-e8-2b", "--text-file", str(TEXT), "--context", "512",
             "--score-last", "256", "--chunk", "256", "--window-sinks", "4", "--window-recent", "64", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["meta"]["key_profile"].startswith("qk/512tok"), out["meta"]
    row = out["rows"][0]
    assert row["variant"] == "hq-e8-2b+profile+window:4:64" and 0 < row["kld"]["512"] < 1, row
    r = run(["eval", "niah", "--model", "smollm2-135m", "--format", "hq-e8-2b", "--text", "kjv-excerpt", "--context", "512",
             "--depths", "0.5", "--chunk", "256", "--window-sinks", "4", "--window-recent", "64", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    cells = {c["variant"]: c for c in json.loads(r.stdout)["records"]}
    assert set(cells) == {"bf16 (oracle)", "hq-e8-2b+profile+window:4:64"} and all(len(c["key"]) == 7 for c in cells.values()), cells


def test_generate_any_decoder_hybrid_plan_line(tmp_path):
    """`hqkv generate --model DIR` on a tiny Qwen3.5 hybrid (three Gated DeltaNet layers, one full-attention layer): bf16 pages give
    transformers' own greedy tokens, and the plan prices the pool's pages beside the fixed state per lane (the exact window plus the
    linear-attention states), as `hqkv.sizing` does."""
    from hqkv.models.load import write_tiny_model, load_causal_lm
    from hqkv.testing import check_greedy, ref_topk, reference_greedy
    from hqkv.sizing import plan
    d = write_tiny_model(tmp_path / "tiny-hybrid", arch="qwen3_5")
    r = run(["generate", "the and of the god", "--model", str(d), "--format", "bf16", "--budget", "2Ktok", "--context", "512",
             "--max-tokens", "8", "--window-sinks", "4", "--window-recent", "64", "--json"], tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    lm = load_causal_lm(d)
    prompt = lm.tokenizer("the and of the god")["input_ids"]
    want = reference_greedy(lm.model, prompt, 8)
    check_greedy(j["tokens"], want[:len(j["tokens"])], ref_topk(lm.model, prompt, want), what="hybrid bf16 pages")   # up to near-ties
    assert j["config"]["model.path"] == str(d)
    p = plan(lm.geometry, "bf16", "2Ktok", context=512, exact_tokens=68)
    assert j["plan"]["state_bytes"] == p.state_bytes == lm.geometry.state_bytes + 68 * 2 * 1 * 2 * 64 * 2    # linear states + window (1 layer, 2 KV heads)
    line = j["vram_plan"]
    assert line.startswith(p.line()) and f"state_per_lane={p.state_bytes} lanes=8 model=tiny-hybrid " in line, line


@pytest.mark.model
def test_real_smollm2_generate_matches_transformers(tmp_path):
    "`hqkv generate --model smollm2-135m` with bf16 pages: transformers' own greedy tokens on a 500-token prompt."
    from hqkv.models.load import fetch_model, ModelUnavailable, load_causal_lm
    from hqkv.testing import check_greedy, ref_topk, reference_greedy
    try: fetch_model("smollm2-135m")
    except ModelUnavailable as e: pytest.skip(str(e))
    lm = load_causal_lm("smollm2-135m")
    text = lm.tokenizer.decode(lm.tokenizer(TEXT.read_text())["input_ids"][:500])
    p = subprocess.run(CLI + ["generate", "--file", "-", "--model", "smollm2-135m", "--format", "bf16", "--budget", "4Ktok", "--context", "1024",
                              "--max-tokens", "16", "--json"], input=text, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    ids = lm.tokenizer(text)["input_ids"]
    want = reference_greedy(lm.model, ids, 16)
    check_greedy(j["tokens"], want[:len(j["tokens"])], ref_topk(lm.model, ids, want), what="SmolLM2 bf16 pages")   # up to near-ties
    assert len(j["tokens"]) >= 1
    assert "model=smollm2-135m" in j["vram_plan"]


@pytest.mark.model
def test_real_smollm2_uses_its_shipped_profile_and_plan(tmp_path):
    "The packaged SmolLM2 runs hq-e8-2b with the profile and 2.5-bit plan that ship for it, with no setting and no calibration."
    from hqkv.models.load import fetch_model, ModelUnavailable
    from hqkv.models.identity import cache_dir
    from hqkv.keyprofile import default_profile
    try: fetch_model("smollm2-135m")
    except ModelUnavailable as e: pytest.skip(str(e))
    (tmp_path / "models").symlink_to(cache_dir() / "models")         # the fetched model, but no profile hqkv calibrate wrote
    r = run(["generate", "--model", "smollm2-135m", "--format", "hq-e8-2b", "--budget", "4Ktok", "--context", "512",
             "--max-tokens", "2", "--json", "In the beginning"], tmp_path)
    assert r.returncode == 0, r.stderr
    j, shipped = json.loads(r.stdout), default_profile("smollm2-135m")
    assert j["key_profile"] == shipped.tag and shipped.plan_for("hq-e8-2b") is not None, j["key_profile"]
    assert f"bit_plan={shipped.plan_for('hq-e8-2b').tag} " in j["vram_plan"], j["vram_plan"]
