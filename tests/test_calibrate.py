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
    code = ("import sys; from hqkv.keyprofile import default_profile; from hqkv.models.identity import model_identity; p = default_profile(); "
            "assert p.mu.shape == (3, 1, 256) and p.layers == (5, 11, 17), (p.mu.shape, p.layers); "
            "heavy = [m for m in ('transformers', 'sentencepiece') if m in sys.modules]; assert not heavy, heavy; "
            "from hqkv.models.gemma3 import Gemma3Config\n"
            "class M: cfg = Gemma3Config()\n"
            "p.check_matches(model_identity(M()))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_runner_profile_end_to_end():
    """Gemma 3 270M on 768 tokens of KJV (profile from the Python docs), hq-e8-2b pages + a small window, prefilled in
    chunks of 256: the runner's key profile gives the same logits as transforming q and k by hand, and a lower KLD
    against the bf16 oracle than no profile."""
    import torch
    torch.set_num_threads(1)
    from hqkv.models.gemma3 import load_gemma3
    from hqkv.fixtures import load_text
    from hqkv.pool import KVPool
    from hqkv.pagedkv import PagedKV
    from hqkv.keyprofile import default_profile; from hqkv.models.identity import model_identity
    m = load_gemma3()
    dp = default_profile()
    dp.check_matches(model_identity(m))
    N, C = 768, 256
    ids = m.tokenizer.encode(load_text("kjv"))[:N]

    class ByHand:   # the transform written out, around a PagedKV view without a profile
        def __init__(self, inner): self.inner, self.slot = inner, {l: i for i, l in enumerate(dp.layers)}
        def attend(self, layer, q, k, v, pos, scale):
            i = self.slot[layer]
            return self.inner.attend(layer, dp.apply_query(i, q), dp.apply_keys(i, k), v, pos, scale)

    def logprobs(kind):
        if kind == "oracle": st = m.new_state()
        else:
            paged = PagedKV(KVPool("gemma-3-270m", "hq-e8-2b", f"{N}tok"), window_sinks=8, window_recent=64, attn="gather",
                            key_profile=dp if kind == "profile" else None)
            paged.admit(0, ids, 0)
            view = paged.view(0)
            st = m.new_state(kv=ByHand(view) if kind == "by hand" else view)
        for a in range(0, N - C, C): m.forward([st], [ids[a:a + C]], logits="none")
        return torch.log_softmax(m.forward([st], [ids[N - C:]], logits=C)[0], -1)

    ref = logprobs("oracle")
    kld = lambda lp: float((ref.exp() * (ref - lp)).sum(-1).mean())
    with_p, by_hand, without = logprobs("profile"), logprobs("by hand"), logprobs("none")
    assert torch.allclose(with_p, by_hand, atol=1e-3), float((with_p - by_hand).abs().max())
    assert kld(with_p) < kld(without), (kld(with_p), kld(without))


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
