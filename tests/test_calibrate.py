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
    code = ("import sys; from hqkv.keyprofile import default_profile; p = default_profile(); "
            "assert p.mu.shape == (3, 1, 256) and p.layers == (5, 11, 17), (p.mu.shape, p.layers); "
            "heavy = [m for m in ('transformers', 'sentencepiece') if m in sys.modules]; assert not heavy, heavy; "
            "from hqkv.models.load import load_causal_lm; from hqkv.models.identity import DEFAULT_MODEL; "
            "p.check_matches(load_causal_lm(DEFAULT_MODEL).identity)")   # the bundled model as transformers loads it
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def test_paged_profile_is_the_transform_by_hand():
    """The shipped profile inside `PagedKV` (hq-e8-2b pages + a small window, real Gemma 3 K/V of the fixture, 768
    tokens in chunks of 256) gives the outputs of a `PagedKV` without one whose q and k are transformed by hand."""
    import torch
    from hqkv.fixtures import load_fixture
    from hqkv.keyprofile import default_profile
    from hqkv.pool import KVPool
    from hqkv.pagedkv import PagedKV
    fx, dp, N, C = load_fixture(), default_profile(), 768, 256
    q = torch.randn(3, N, 4, 256, generator=torch.Generator().manual_seed(0)) * fx.q.std()
    ids = fx.token_ids[:N].tolist()
    def run(profile, by_hand):
        paged = PagedKV(KVPool("gemma-3-270m", "hq-e8-2b", f"{N}tok"), window_sinks=8, window_recent=64, attn="gather",
                        key_profile=profile)
        paged.admit(0, ids, 0)
        outs = []
        for a in range(0, N, C):
            paged.begin([0], [a], [ids[a:a + C]])
            for li in range(3):
                qq, kk = q[li, a:a + C], fx.k[li, a:a + C]
                if by_hand: qq, kk = dp.apply_query(li, qq), dp.apply_keys(li, kk)
                outs.append(paged.attend(li, qq, kk, fx.v[li, a:a + C], fx.scale))
            paged.end()
        return torch.cat(outs)
    with_p, by_hand = run(dp, False), run(None, True)
    assert torch.allclose(with_p, by_hand, atol=1e-3), float((with_p - by_hand).abs().max())


def test_profile_lowers_kld_end_to_end():
    "Gemma 3 270M (transformers) on 768 tokens of KJV, hq-e8-2b + a small window: the shipped profile lowers the KLD."
    import torch
    torch.set_num_threads(1)
    from hqkv.models.load import load_causal_lm
    from hqkv.models.identity import DEFAULT_MODEL
    from hqkv.quality import HFModel, eval_text, text_windows, kld_eval
    m = HFModel(load_causal_lm(DEFAULT_MODEL))
    (win, nxt), = text_windows(m.tokenizer.encode(eval_text("kjv-excerpt"), add_bos=False), 768, 1)
    res = kld_eval(m, win, nxt, ["hq-e8-2b+profile+window:8:64", "hq-e8-2b+window:8:64"], chunk=256, score_last=256)
    with_p, without = (res[n].summary()["kld"] for n in ("hq-e8-2b+profile+window:8:64", "hq-e8-2b+window:8:64"))
    assert with_p < without, (with_p, without)


def test_calibrate_out_is_checked_before_the_model_loads(tmp_path):
    "--out that holds something else is not overwritten without --force; a parent that is a file is named; both before any model loads."
    text = tmp_path / "t.txt"; text.write_text("In the beginning God created the heaven and the earth. " * 20)
    notes = tmp_path / "notes.txt"; notes.write_text("my notes")
    for out, msg in ((notes, "exists and is not a key profile: refusing to overwrite it (use --force)"),
                     (notes / "p.pt", f"{notes} is a file, not a directory"), (tmp_path, "is a directory; give a file name")):
        r = subprocess.run(CLI + ["calibrate", "--model", "/nonexistent-model", "--text-file", str(text), "--out", str(out)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert notes.read_text() == "my notes"


def test_damaged_profile_file_is_named(tmp_path):
    import json as _json, pytest as _pytest, torch
    from hqkv.keyprofile import KeyProfile, default_profile
    p = tmp_path / "p.pt"
    default_profile().save(p)
    b = torch.load(p, weights_only=True)
    for meta, msg in (("{not json", "JSONDecodeError"), (_json.dumps({"version": _json.loads(b["meta"])["version"]}), "KeyError")):
        torch.save({**b, "meta": meta}, p)
        with _pytest.raises(ValueError, match=f"{p}: the key profile file is damaged \\({msg}"): KeyProfile.load(p)
