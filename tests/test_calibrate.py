"""The key profile: the `hqkv calibrate` command is wired into the CLI, and the shipped profile loads light and matches the default model."""
import subprocess, sys

# the console script `hqkv` (`python -m hqkv.cli` runs cli.py as __main__, a second copy that commands registered elsewhere do not reach)
CLI = [sys.executable, "-c", "from hqkv.cli import main; raise SystemExit(main())"]


def test_calibrate_command_help():
    r = subprocess.run(CLI + ["calibrate", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for flag in ("--model", "--text-file", "--out", "--tokens", "--mode"):
        assert flag in r.stdout, flag


def test_calibrate_bad_input_exit_code():
    r = subprocess.run(CLI + ["calibrate", "--text-file", "/nonexistent.txt", "--out", "/tmp/x.pt"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_default_profile_is_light_and_matches():
    code = ("import sys; from hqkv.calibrate import default_profile, model_identity; p = default_profile(); "
            "assert p.mu.shape == (3, 1, 256) and p.layers == (5, 11, 17), (p.mu.shape, p.layers); "
            "heavy = [m for m in ('transformers', 'sentencepiece') if m in sys.modules]; assert not heavy, heavy; "
            "from hqkv.models.gemma3 import Gemma3Config\n"
            "class M: cfg = Gemma3Config()\n"
            "p.check_matches(model_identity(M()))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
