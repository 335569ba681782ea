"""Is a hybrid model's mixed page geometry read right? Gemma 3 with its global layers in a near-lossless format (q8_0)
and its sliding layers in bf16 pages of another block size (68 tokens beside 128): the delta NLL against vLLM's bf16
rows must be ~0, as it is with every layer in q8_0. Uses the window and the bf16 scores of `check.py quality`.

  python tools/vllm/diag_sliding.py MODEL_DIR HQKV_QUALITY_JSON VLLM_QUALITY_JSON OUT_JSON   (vLLM's venv)"""
import json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))

def main(model, hq_path, vl_path, out):
    import check
    w, v = json.loads(Path(hq_path).read_text()), json.loads(Path(vl_path).read_text())
    ids, ref = w["ids"] + [w["next_id"]], v["per_position"]["bf16"]["nll"]
    rows = []
    for fmt, sw in (("q8_0", "bf16"), ("q8_0", None)):
        llm, _ = check._llm(model, fmt, None, max_num_batched_tokens=w["chunk"], max_num_seqs=1, sliding=sw)
        nll, _ = check._prompt_scores(llm, ids, w["score_last"])
        rows.append(dict(kv_format=fmt, sliding_format=sw or fmt, dnll_vs_bf16=sum(a - b for a, b in zip(nll, ref)) / len(nll),
                         nll_mean_abs_diff_vs_bf16=sum(abs(a - b) for a, b in zip(nll, ref)) / len(nll)))
        print(rows[-1], flush=True)
        check._close(llm)
    Path(out).write_text(json.dumps(dict(model=model, window_tokens=len(w["ids"]), chunk=w["chunk"], scored=w["score_last"], rows=rows), indent=1) + "\n")

if __name__ == "__main__":
    main(*sys.argv[1:5])
