"""hqkv's side of `make vllm-check` (run with hqkv's own venv): the models converted to the transformers layout vLLM
loads, their key profiles, and hqkv's own quality numbers on the window the vLLM run scores.

  python tools/vllm/prepare.py models  --out WORK/models.json      converted dirs + key profiles (calibrated if missing)
  python tools/vllm/prepare.py quality --model NAME --out WORK/q.json   a KJV window + hqkv's KLD / top-1 / dNLL on it
"""
import argparse, json, subprocess, sys, time
from pathlib import Path

MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "gemma-3-270m")

def _load(name):
    from hqkv.models.load import load_causal_lm, converted_dir
    lm = load_causal_lm(name)
    return lm, converted_dir(Path(lm.source))

def _profile(lm, name):
    from hqkv.keyprofile import find_profile, CALIB_TEXT, PROFILE_FILES
    from hqkv.fixtures import DATA_DIR
    if name in PROFILE_FILES: return str(DATA_DIR / PROFILE_FILES[name])   # the shipped one (Gemma 3 270M: its 3 global layers)
    p = find_profile(lm.identity)
    if p is None:
        # the first 8,192 tokens of the calibration text (the whole of it is 12.7K tokens, past SmolLM2's 8K context)
        subprocess.run([sys.executable, "-m", "hqkv.cli", "calibrate", "--model", name, "--text-file", str(CALIB_TEXT), "--tokens", "8192"], check=True)
        p = find_profile(lm.identity)
    from hqkv.keyprofile import profile_path
    hits = sorted(profile_path(lm.identity).parent.glob(f"*-{lm.identity.weights_sha256[:12]}-{lm.identity.config_sha256[:8]}.pt"))
    return str(hits[0]) if hits else None

def cmd_models(a):
    out = {}
    for name in a.names.split(","):
        lm, d = _load(name)
        out[name] = dict(dir=str(d), profile=_profile(lm, name), identity=lm.identity.short())
        print(name, out[name], flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))

def cmd_quality(a):
    import torch
    from hqkv.quality import HFModel, text_ids, text_windows, kld_eval
    from hqkv.keyprofile import KeyProfile
    torch.manual_seed(0)
    lm, d = _load(a.model)
    model = HFModel(lm)
    ids = text_ids(model, a.text)
    w, nx = text_windows(ids, a.context, 1, bos=model.tokenizer.bos_id)[0]
    prof = KeyProfile.load(a.profile) if a.profile else None
    t = time.time()
    res = kld_eval(model, w, nx, a.variants.split(","), chunk=a.chunk, score_last=a.score_last, profile=prof, regime="prefill")   # vLLM scores prompt positions in prefill chunks
    out = dict(model=a.model, dir=str(d), text=a.text, regime="prefill", ids=list(map(int, w)), next_id=int(nx), chunk=a.chunk, score_last=a.score_last,
               seconds=round(time.time() - t, 1),
               hqkv={k: dict(**v.summary(), nll=v.nll.tolist(), nll_ref=v.nll_ref.tolist()) for k, v in res.items()})
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out))
    print(json.dumps({k: {m: v[m] for m in ("kld", "top1", "dnll", "n")} for k, v in out["hqkv"].items()}, indent=1), out["seconds"], "s")

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("models"); s.add_argument("--names", default=",".join(MODELS)); s.add_argument("--out", required=True)
    s = sub.add_parser("quality"); s.add_argument("--model", required=True); s.add_argument("--profile"); s.add_argument("--text", default="kjv-excerpt")
    s.add_argument("--context", type=int, default=2048); s.add_argument("--chunk", type=int, default=1024); s.add_argument("--score-last", type=int, default=1024)
    s.add_argument("--variants", default="hq-e8-2b,hq-e8-2b+profile,hq-e8-2b+window:0:512,hq-e8-2b+window:16:512,hq-e8-2b+profile+window:16:512", help="hqkv variants (hqkv.quality.KVVariant names) scored against bf16")
    s.add_argument("--out", required=True)
    a = ap.parse_args()
    globals()["cmd_" + a.cmd](a)

if __name__ == "__main__":
    main()
