"""On a machine without a C++ compiler the CPU kernels cannot be built: the default attention backend is then `gather`,
with one warning that says why and how to get them; asking for `cpu` by name fails with the compiler named (no silent
fallback). Simulated in a child process with an empty cache directory and CXX naming no program."""
import subprocess, sys, textwrap

CHILD = textwrap.dedent('''
    import warnings
    from hqkv.pool import KVPool
    from hqkv.backends import default_backend, get_backend
    pool = KVPool("gemma-3-270m", "hq-e8-2b", "1Ktok")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        picked = [default_backend(pool), default_backend(pool)]
    assert picked == ["gather", "gather"], picked
    assert len(w) == 1 and "Install g++" in str(w[0].message) and "no-such-compiler" in str(w[0].message), [str(x.message) for x in w]
    try: get_backend("cpu").check(pool); from hqkv.attention_cpu import lib; lib()
    except RuntimeError as e: assert "no-such-compiler" in str(e), e
    else: raise AssertionError("attn='cpu' without a compiler did not fail")
    print("ok")
''')

def test_no_compiler_means_gather_with_one_warning(tmp_path):
    env = {**__import__("os").environ, "HQKV_CACHE_DIR": str(tmp_path), "CXX": "no-such-compiler"}
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]
