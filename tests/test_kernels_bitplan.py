"""A bit plan's pool runs on the Triton kernels: layers whose keys or values are in other formats than the pool's (tbq3 keys,
q8_0 and tbq2 values beside hq-e8-2b) go through `PagedKV(attn='triton')` (store, prefill, decode) and give the torch
reference's outputs. Under the Triton interpreter in a child process (it must be set before triton is imported)."""
import os, subprocess, sys, textwrap

CHILD = textwrap.dedent('''
    import torch
    from hqkv.pool import KVPool
    from hqkv.pagedkv import PagedKV
    torch.manual_seed(0)
    Hq, Hkv, D = 4, 1, 256
    W = [[torch.randn(D, h * D, dtype=torch.float64) / D ** 0.5 for h in (Hq, Hkv, Hkv)] for _ in range(3)]
    emb = torch.randn(97, D, dtype=torch.float64)
    def step(paged, ids, pos0, chunks):
        st = paged.begin(ids, pos0, chunks)
        t = torch.cat([torch.tensor(c) for c in chunks])
        x = emb[t] * (1 + 0.01 * st.positions[:, None])
        for li, w in enumerate(W):
            q, k, v = ((x @ m).float().view(len(t), -1, D) for m in w)
            o = paged.attend(li, q, k, v, 1 / 16)
        paged.end()
        return o
    def run(attn, window):
        pool = KVPool("gemma-3-270m", "hq-e8-2b", "1Ktok", key_formats={5: "tbq3"}, value_formats={11: "q8_0", 17: "tbq2"},
                      codec_opts={"tbq3": {"allow": True}})
        assert [(pool.k_codec(i).name, pool.v_codec(i).name) for i in range(3)] == [("tbq3", "hq-e8-2b"), ("hq-e8-2b", "q8_0"), ("hq-e8-2b", "tbq2")]
        paged = PagedKV(pool, attn=attn, window_sinks=window[0], window_recent=window[1])
        seqs = [[3, 1, 4, 1, 5, 9, 2, 6] * 12, [2, 7, 1, 8] * 5]
        for i, s in enumerate(seqs): paged.admit(i, s, 8)
        outs = [step(paged, [0, 1], [0, 0], [seqs[0][:64], seqs[1]]), step(paged, [0], [64], [seqs[0][64:]])]
        for t in range(3): outs.append(step(paged, [0, 1], [len(seqs[0]) + t, len(seqs[1]) + t], [[t + 1], [t + 2]]))
        return torch.cat(outs)
    for window in ((0, 0), (4, 16)):
        ref, tri = run("ref", window), run("triton", window)
        err = float((tri - ref).abs().max() / ref.norm(dim=-1).max())
        assert err < 1e-5, (window, err)
    print("ok")
''')

def test_bit_plan_runs_on_the_triton_kernels():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]
