"""hqkv pages inside vLLM: the checks of `make vllm-check` (run with the python of vLLM's own venv, tools/vllm/setup.sh).

  python tools/vllm/check.py capacity --models smollm2-135m=DIR,...   vLLM's own KV capacity, stock vs hqkv pages
  python tools/vllm/check.py greedy   --model DIR                    greedy tokens: stock vs bf16 rows vs hq-e8-2b
  python tools/vllm/check.py quality  --model DIR --window JSON      teacher-forced NLL / top-1 through vLLM
  python tools/vllm/check.py serve    --model DIR                    api_server + plugin, openai client, /metrics
  python tools/vllm/check.py tp       --model DIR                    tensor parallel 2

Every run is bounded (engine init + a few prompts) and talks only to 127.0.0.1. Results go to --out as JSON.
"""
import argparse, json, os, re, subprocess, sys, tempfile, time, urllib.request
from contextlib import contextmanager
from pathlib import Path

KV_BYTES = 256 * 2**20        # the same KV memory for every variant (vLLM's kv_cache_memory_bytes on CPU)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "In the beginning God created",
           "Here is a list of the planets of the solar system:", "import numpy as np\nx = np.arange(10)\n"]

def long_prompt(chars=4000):
    "~1000 tokens of the KJV excerpt hqkv ships: a prefix over several pages, past Gemma 3's 512-token sliding window."
    import hqkv
    t = (Path(hqkv.__file__).parent / "data" / "kjv_excerpt.txt").read_text()
    return t[:chars] + "\n\nIn one sentence, the passage above says that"

WINDOW = (16, 512)            # the exact window (sinks, recent) when a run has one: the plugin's defaults
NO_WINDOW = (0, 0)

def window_of_name(variant:str) -> tuple[int, int]:
    "(sinks, recent) of a hqkv variant name: '...+window:S:R' -> (S, R); no window -> (0, 0)."
    m = re.search(r"\+window:(\d+):(\d+)", variant)
    return (int(m.group(1)), int(m.group(2))) if m else NO_WINDOW

def _env(fmt, profile=None, sliding=None, window=NO_WINDOW):
    "os.environ for an engine: the plugin on (fmt) or off (None), the exact window (sinks, recent); the engine core process inherits it."
    for k in ("HQKV_VLLM_FORMAT", "HQKV_VLLM_KEY_PROFILE", "HQKV_VLLM_SLIDING_FORMAT", "HQKV_VLLM_WINDOW_SINKS", "HQKV_VLLM_WINDOW_RECENT"): os.environ.pop(k, None)
    if fmt: os.environ.update(HQKV_VLLM_FORMAT=fmt, HQKV_VLLM_WINDOW_SINKS=str(window[0]), HQKV_VLLM_WINDOW_RECENT=str(window[1]))
    if profile: os.environ["HQKV_VLLM_KEY_PROFILE"] = str(profile)
    if sliding: os.environ["HQKV_VLLM_SLIDING_FORMAT"] = sliding

def _llm(model, fmt, profile=None, dtype="float32", sliding=None, window=NO_WINDOW, **kw):
    from vllm import LLM
    _env(fmt, profile, sliding, window)
    args = dict(model=str(model), dtype=dtype, enforce_eager=True, max_model_len=4096, max_num_seqs=8,
                kv_cache_memory_bytes=KV_BYTES, seed=0, enable_prefix_caching=False)
    args.update(kw)
    t = time.time(); llm = LLM(**args)
    return llm, round(time.time() - t, 1)

@contextmanager
def _fd_log(path):
    "Send this process's stdout/stderr (and so the engine process it spawns) to `path` while the engine starts."
    sys.stdout.flush(); sys.stderr.flush()
    saved, f = (os.dup(1), os.dup(2)), os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(f, 1); os.dup2(f, 2)
    try: yield
    finally:
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(saved[0], 1); os.dup2(saved[1], 2)
        for x in (*saved, f): os.close(x)

def _reported_tokens(path):
    "vLLM's own capacity line: 'CPU KV cache size: N tokens' (for hybrids it assumes sliding layers grow like global ones)."
    m = re.findall(r"KV cache size: ([\d,]+) tokens", Path(path).read_text(errors="replace"))
    return int(m[-1].replace(",", "")) if m else None

def _close(llm):
    import gc
    try: llm.llm_engine.engine_core.shutdown()
    except Exception: pass
    del llm; gc.collect()

def _capacity(llm):
    cc = llm.llm_engine.vllm_config.cache_config
    return dict(num_gpu_blocks=cc.num_gpu_blocks, block_size=cc.block_size, kv_cache_tokens=cc.num_gpu_blocks * cc.block_size,
                kv_cache_memory_bytes=cc.kv_cache_memory_bytes)

def _geometry(model):
    c = json.loads((Path(model) / "config.json").read_text())
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    types = c.get("layer_types") or ["full_attention"] * c["num_hidden_layers"]
    return dict(layers=c["num_hidden_layers"], kv_heads=c["num_key_value_heads"], head_dim=hd, model_type=c["model_type"],
                full_layers=types.count("full_attention"), sliding_layers=types.count("sliding_attention"),
                sliding_window=c.get("sliding_window") if "sliding_attention" in types else None)

def single_sequence_tokens(g, blocks, full_block, sliding_block, window=NO_WINDOW, window_block=None):
    """The longest one sequence the pool holds: vLLM groups layers in groups of the full layers' count (Gemma 3 270M:
    1 full + 5 sliding groups of 3); a block id is one page in every layer of a group; a sliding group keeps
    ceil((window - 1) / block) + 1 blocks per sequence whatever its length, the full group one block per `full_block` tokens.
    hqkv's exact window is one more sliding group (a layer per full layer) of `recent + 1` tokens and a sink group of one block."""
    used = 0
    if g["sliding_layers"]: used += (g["sliding_layers"] // g["full_layers"]) * (-(-(g["sliding_window"] - 1) // sliding_block) + 1)
    sinks, recent = window
    if recent: used += -(-recent // window_block) + 1
    if sinks: used += 1
    return (blocks - used) * full_block

def cmd_capacity(a):
    from hqkv.sizing import Geometry, bytes_per_token
    rows = []
    for spec in a.models.split(","):
        name, d = spec.split("=", 1)
        g = _geometry(d)
        geo = Geometry(name, layers=g["layers"], attn_layers=g["layers"], kv_heads=g["kv_heads"], head_dim=g["head_dim"])
        plan = {f: bytes_per_token(geo, f) for f in ("bf16", "hq-e8-2b")}
        variants = [("vllm stock, fp32 model (fp32 cache)", None, "float32", None, NO_WINDOW), ("vllm stock, bf16 model (bf16 cache)", None, "bfloat16", None, NO_WINDOW),
                    ("hqkv bf16 rows", "bf16", "float32", None, NO_WINDOW), ("hqkv hq-e8-2b rows", "hq-e8-2b", "float32", None, NO_WINDOW),
                    (f"hqkv hq-e8-2b rows + exact window {WINDOW[0]}+{WINDOW[1]}", "hq-e8-2b", "float32", None, WINDOW)]
        if g["sliding_layers"]: variants.append(("hqkv hq-e8-2b full layers + bf16 sliding layers", "hq-e8-2b", "float32", "bf16", NO_WINDOW))
        for label, fmt, dtype, sliding, window in variants:
            from hqkv.vllm import sliding_block_size
            log = tempfile.mktemp(prefix="hqkv-vllm-", suffix=".log")
            with _fd_log(log): llm, init_s = _llm(d, fmt, dtype=dtype, sliding=sliding, window=window)
            cap = _capacity(llm)
            cap["vllm_reported_kv_cache_tokens"] = _reported_tokens(log)
            sb, wb = cap["block_size"], None
            if sliding or any(window):      # vLLM reports the smallest group's block size; the full pages (and coded sliding ones) stay 128 tokens
                cap["block_size"] = sb = 128; cap["kv_cache_tokens"] = cap["num_gpu_blocks"] * 128
            if sliding: sb = cap["sliding_block_size"] = sliding_block_size(128, fmt, sliding, g["head_dim"])
            if any(window): wb = cap["window_block_size"] = sliding_block_size(128, fmt, "bf16", g["head_dim"])
            rows.append(dict(model=name, variant=label, kv_format=fmt or "vllm", sliding_format=sliding, window=list(window), dtype=dtype, init_seconds=init_s,
                             single_sequence_tokens=single_sequence_tokens(g, cap["num_gpu_blocks"], 128, sb, window, wb), **cap))
            print(json.dumps(rows[-1]), flush=True)
            _close(llm)
        by = {r["variant"]: r["kv_cache_tokens"] for r in rows if r["model"] == name}
        seq = {r["variant"]: r["single_sequence_tokens"] for r in rows if r["model"] == name and not r.get("summary")}
        rows.append(dict(model=name, summary=True, geometry=g, single_sequence_tokens=seq,
                         ratio_hq_e8_2b_vs_stock_bf16=by["hqkv hq-e8-2b rows"] / by["vllm stock, bf16 model (bf16 cache)"],
                         ratio_hq_e8_2b_vs_stock_fp32=by["hqkv hq-e8-2b rows"] / by["vllm stock, fp32 model (fp32 cache)"],
                         ratio_hq_e8_2b_vs_hqkv_bf16=by["hqkv hq-e8-2b rows"] / by["hqkv bf16 rows"],
                         ratio_bf16_rows_vs_stock_bf16=by["hqkv bf16 rows"] / by["vllm stock, bf16 model (bf16 cache)"],
                         hqkv_plan_bytes_per_token=plan, hqkv_plan_ratio=plan["bf16"] / plan["hq-e8-2b"]))
        print(json.dumps(rows[-1]), flush=True)
    _save(a.out, dict(kv_cache_memory_bytes=KV_BYTES, rows=rows))

def _greedy(llm, n, margins=None, prompt_ids=None):
    "Greedy ids and texts of PROMPTS + the long one; `margins` (a list) gets each step's top-1 minus top-2 logprob per prompt, `prompt_ids` each prompt's ids."
    from vllm import SamplingParams
    outs = llm.generate(PROMPTS + [long_prompt()], SamplingParams(temperature=0, max_tokens=n, logprobs=2 if margins is not None else None), use_tqdm=False)
    if margins is not None:
        for o in outs:
            lp = [sorted((x.logprob for x in d.values()), reverse=True) for d in o.outputs[0].logprobs]
            margins.append([round(a[0] - a[1], 4) if len(a) > 1 else None for a in lp])
    if prompt_ids is not None: prompt_ids.extend(list(o.prompt_token_ids) for o in outs)
    return [list(o.outputs[0].token_ids) for o in outs], [o.outputs[0].text for o in outs]

def _near_tie_check(model, prompts, want, got):
    """hqkv.testing's rule for two float paths: `got` must equal vLLM stock's `want` up to the first position where
    the reference (transformers' own fp32 forward of the same checkpoint, along `want`) has its best two within NEAR_TIE."""
    import torch
    from transformers import AutoModelForCausalLM
    from hqkv.testing import check_greedy, ref_topk
    ref = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    verified = []
    for p, w, g in zip(prompts, want, got):
        try: verified.append(check_greedy(g, w, ref_topk(ref, p, w), what="hqkv bf16 rows vs vLLM stock"))
        except AssertionError as e: return dict(ok=False, error=str(e))
    return dict(ok=True, tokens_verified=verified)

def cmd_greedy(a):
    res, prompt_ids = {}, []
    hybrid = bool(_geometry(a.model)["sliding_layers"])
    for label, fmt, prof, sw in (("vllm stock", None, None, None), ("hqkv bf16 rows", "bf16", None, None), ("hqkv hq-e8-2b", "hq-e8-2b", None, None),
                                 ("hqkv hq-e8-2b+profile", "hq-e8-2b", a.profile, None),
                                 ("hqkv hq-e8-2b+profile, bf16 sliding layers", "hq-e8-2b", a.profile, "bf16"),
                                 (f"hqkv hq-e8-2b+profile+window {WINDOW[0]}+{WINDOW[1]}", "hq-e8-2b", a.profile, None),
                                 (f"hqkv hq-e8-2b+profile+window {WINDOW[0]}+{WINDOW[1]}, bf16 sliding layers", "hq-e8-2b", a.profile, "bf16")):
        if "profile" in label and not a.profile: continue
        if sw and not hybrid: continue                     # a hybrid's own engine setting: sliding layers exact, the window on the global ones
        llm, init_s = _llm(a.model, fmt, prof, sliding=sw, window=WINDOW if "window" in label else NO_WINDOW)
        t = time.time(); ids, texts = _greedy(llm, a.tokens, prompt_ids=None if prompt_ids else prompt_ids)   # the prompts' ids once (stock's run)
        res[label] = dict(ids=ids, texts=texts, init_seconds=init_s, generate_seconds=round(time.time() - t, 1), **_capacity(llm))
        print(label, json.dumps(texts)[:300], flush=True)
        _close(llm)
    ref = res["vllm stock"]["ids"]
    def agree(ids): return [next((i for i, (x, y) in enumerate(zip(r, o)) if x != y), min(len(r), len(o))) for r, o in zip(ref, ids)]
    for v in res.values(): v["first_difference"] = agree(v["ids"]); v["equal"] = v["ids"] == ref
    # bf16 rows must be vLLM's own tokens up to the reference's near-ties (another CPU rounds differently: hqkv.testing)
    bf = res["hqkv bf16 rows"]; bf["near_tie_check"] = _near_tie_check(a.model, prompt_ids, ref, bf["ids"])
    out = dict(model=a.model, prompts=PROMPTS + [long_prompt()[:200] + "..."], max_tokens=a.tokens, results=res)
    _save(a.out, out)
    print({k: (v["equal"], v["first_difference"]) for k, v in res.items()}, bf["near_tie_check"])
    if not bf["near_tie_check"]["ok"]: sys.exit("bf16 rows through the plugin left vLLM's own greedy tokens where the reference is decided: " + bf["near_tie_check"]["error"])

def _prompt_scores(llm, ids, score_last):
    "Teacher-forced: -log p(token i | < i) and whether it is the top-1, for the last `score_last` targets of `ids`."
    from vllm import SamplingParams, TokensPrompt
    o = llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1), use_tqdm=False)[0]
    nll, top = [], []
    for i in range(len(ids) - score_last, len(ids)):
        d = o.prompt_logprobs[i]
        nll.append(-d[ids[i]].logprob)
        top.append(min(d.items(), key=lambda kv: kv[1].rank)[0])
    return nll, top

def cmd_quality(a):
    w = json.loads(Path(a.window).read_text())
    ids = w["ids"] + [w["next_id"]]
    res = {}
    runs = [("vllm stock", None, None), ("bf16", "bf16", None)]
    for v in w["hqkv"]:                # every variant hqkv's side scored: hq-e8-2b, +profile, +window:S:R (hqkv's names)
        if not v.startswith("hq-e8-2b") or not set(v.split("+")[1:]) <= {"profile"} | {x for x in v.split("+") if x.startswith("window:")}:
            raise SystemExit(f"check.py quality: no vLLM run for hqkv variant {v!r}")
        if "+profile" in v and not a.profile: raise SystemExit(f"check.py quality: {v} needs --profile")
        runs.append((v, "hq-e8-2b", a.profile if "+profile" in v else None))
    for label, fmt, prof in runs:
        llm, _ = _llm(a.model, fmt, prof, max_num_batched_tokens=w["chunk"], max_num_seqs=1, sliding=a.sliding if fmt == "hq-e8-2b" else None, window=window_of_name(label))
        t = time.time(); nll, top = _prompt_scores(llm, ids, w["score_last"])
        res[label] = dict(nll=nll, top=top, seconds=round(time.time() - t, 1))
        print(label, sum(nll) / len(nll), res[label]["seconds"], flush=True)
        _close(llm)
    ref = res["bf16"]
    summ = {}
    for k, v in res.items():
        n = len(v["nll"])
        summ[k] = dict(mean_nll=sum(v["nll"]) / n, dnll_vs_bf16=sum(x - y for x, y in zip(v["nll"], ref["nll"])) / n,
                       top1_vs_bf16=sum(x == y for x, y in zip(v["top"], ref["top"])) / n, seconds=v["seconds"], n=n)
    _save(a.out, dict(model=a.model, sliding_format=a.sliding, window=dict(tokens=len(w["ids"]), chunk=w["chunk"], score_last=w["score_last"], text=w["text"]),
                      summary=summ, per_position={k: dict(nll=v["nll"], top=v["top"]) for k, v in res.items()}))
    print(json.dumps(summ, indent=1))

def _get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r: return r.read().decode()

def cmd_serve(a):
    port = a.port
    env = dict(os.environ, HQKV_VLLM_FORMAT=a.format)                 # the plugin's defaults otherwise (exact window of 512)
    for k in ("HQKV_VLLM_KEY_PROFILE", "HQKV_VLLM_WINDOW_SINKS", "HQKV_VLLM_WINDOW_RECENT", "HQKV_VLLM_SLIDING_FORMAT"): env.pop(k, None)
    if a.profile: env["HQKV_VLLM_KEY_PROFILE"] = a.profile
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", a.model, "--served-model-name", "m",
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "4096",
           "--kv-cache-memory-bytes", str(KV_BYTES), "--seed", "0"]
    log = open(a.log, "w")
    p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    out = dict(command=" ".join(cmd), kv_format=a.format)
    try:
        t = time.time()
        while time.time() - t < a.timeout:
            if p.poll() is not None: raise RuntimeError(f"api_server exited with {p.returncode}: see {a.log}")
            try:
                if _get(f"http://127.0.0.1:{port}/health") is not None: break
            except Exception: time.sleep(2)
        else: raise TimeoutError(f"api_server not healthy in {a.timeout} s")
        out["startup_seconds"] = round(time.time() - t, 1)
        from openai import OpenAI
        cl = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=120)
        r = cl.completions.create(model="m", prompt="The capital of France is", max_tokens=16, temperature=0)
        out["completion"] = r.choices[0].text
        r = cl.chat.completions.create(model="m", messages=[{"role": "user", "content": "Name three colours."}], max_tokens=24, temperature=0)
        out["chat"] = r.choices[0].message.content
        chunks = [c.choices[0].text for c in cl.completions.create(model="m", prompt="def add(a, b):", max_tokens=16, temperature=0, stream=True)]
        out["stream_chunks"] = len(chunks); out["stream_text"] = "".join(chunks)
        m = _get(f"http://127.0.0.1:{port}/metrics")
        out["metrics"] = [l for l in m.splitlines() if l.startswith(("vllm:cache_config_info", "vllm:kv_cache_usage_perc", "vllm:num_requests"))]
        info = next((l for l in out["metrics"] if l.startswith("vllm:cache_config_info")), "")
        lab = dict(re.findall(r'(\w+)="([^"]*)"', info))
        out["cache_config_info"] = {k: lab.get(k) for k in ("num_gpu_blocks", "block_size", "cache_dtype", "kv_cache_memory_bytes") if k in lab}
        logtxt = Path(a.log).read_text()
        out["log_kv_cache_size"] = re.findall(r"KV cache size: [\d,]+ tokens", logtxt)
        out["log_hqkv"] = sorted(set(re.findall(r"hqkv pages: [^\n]*", logtxt)))[:3]
    finally:
        p.terminate()
        try: p.wait(30)
        except subprocess.TimeoutExpired: p.kill(); p.wait()
    _save(a.out, out)
    print(json.dumps(out, indent=1))

def cmd_tp(a):
    # two ranks on a 2-core machine: one core each, none held back for the scheduler (vLLM reserves one per rank by default)
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    res = {}
    for label, fmt, prof, window in (("vllm stock tp2", None, None, NO_WINDOW), ("hqkv bf16 rows tp2", "bf16", None, NO_WINDOW),
                                     (f"hqkv hq-e8-2b+window {WINDOW[0]}+{WINDOW[1]} tp2", a.format, a.profile, WINDOW)):
        try:
            llm, init_s = _llm(a.model, fmt, prof, tensor_parallel_size=2, distributed_executor_backend="mp", window=window)
            margins = []
            ids, texts = _greedy(llm, 16, margins)
            res[label] = dict(ok=True, init_seconds=init_s, texts=texts, ids=ids, top2_margins=margins, **_capacity(llm))
            _close(llm)
        except Exception as e:
            res[label] = dict(ok=False, error=f"{type(e).__name__}: {e}"[:2000])
        print(label, json.dumps(res[label])[:400], flush=True)
    ok = [r for r in res.values() if r["ok"]]
    if len(ok) == len(res):
        st, bf = res["vllm stock tp2"], res["hqkv bf16 rows tp2"]
        bf["equal_to_stock"] = bf["ids"] == st["ids"]
        # where bf16 rows and vLLM's fp32 cache part, how close stock's own top-2 were at that step (a near-tie flips on rounding)
        bf["differences"] = [dict(prompt=i, step=j, stock_top2_margin=st["top2_margins"][i][j])
                             for i, (x, y) in enumerate(zip(st["ids"], bf["ids"]))
                             for j in [next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), None)] if j is not None]
    _save(a.out, dict(model=a.model, results=res))

def _save(path, obj):
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(obj, indent=1) + "\n")
        print("saved", path)

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("capacity"); s.add_argument("--models", required=True); s.add_argument("--out")
    s = sub.add_parser("greedy"); s.add_argument("--model", required=True); s.add_argument("--profile"); s.add_argument("--tokens", type=int, default=32); s.add_argument("--out")
    s = sub.add_parser("quality"); s.add_argument("--model", required=True); s.add_argument("--window", required=True); s.add_argument("--profile"); s.add_argument("--out")
    s.add_argument("--sliding", help="sliding-window layers' format for the hq-e8-2b runs (bf16: exact, as hqkv's own HF cache keeps them)")
    s = sub.add_parser("serve"); s.add_argument("--model", required=True); s.add_argument("--format", default="hq-e8-2b"); s.add_argument("--profile")
    s.add_argument("--port", type=int, default=8765); s.add_argument("--timeout", type=int, default=300); s.add_argument("--log", default="/tmp/hqkv-vllm-serve.log"); s.add_argument("--out")
    s = sub.add_parser("tp"); s.add_argument("--model", required=True); s.add_argument("--format", default="hq-e8-2b"); s.add_argument("--profile"); s.add_argument("--out")
    a = ap.parse_args()
    globals()["cmd_" + a.cmd](a)

if __name__ == "__main__":
    main()
