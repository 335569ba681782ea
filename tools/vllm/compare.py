"""hqkv's own numbers vs the same model, text and chunking through vLLM with hqkv pages: one table.

  python tools/vllm/compare.py HQKV_JSON VLLM_JSON OUT_JSON
vLLM returns only top-k log-probabilities, so the comparison is on what both sides give exactly: the NLL of the
actual next token at every scored position (delta NLL against each side's own bf16-rows oracle) and top-1 agreement
with the oracle. hqkv's KLD is listed for reference."""
import json, sys
from pathlib import Path

def main(hq_path, vl_path, out_path):
    hq, vl = json.loads(Path(hq_path).read_text()), json.loads(Path(vl_path).read_text())
    n = hq["score_last"]
    pv = vl["per_position"]
    mean = lambda xs: sum(xs) / len(xs)
    rows = []
    for variant in (v for v in hq["hqkv"] if v in pv):
        h, v = hq["hqkv"][variant], pv[variant]
        rows.append(dict(variant=variant, hqkv_kld=h["kld"], hqkv_top1=h["top1"], hqkv_dnll=h["dnll"],
                         vllm_top1=vl["summary"][variant]["top1_vs_bf16"], vllm_dnll=vl["summary"][variant]["dnll_vs_bf16"],
                         nll_mean_abs_diff_per_position=mean([abs(a - b) for a, b in zip(h["nll"], v["nll"])])))
    oracle = dict(hqkv_bf16_mean_nll=mean(hq["hqkv"]["hq-e8-2b"]["nll_ref"]), vllm_bf16_rows_mean_nll=mean(pv["bf16"]["nll"]),
                  vllm_stock_mean_nll=mean(pv["vllm stock"]["nll"]),
                  nll_mean_abs_diff_hqkv_bf16_vs_vllm_bf16_rows=mean([abs(a - b) for a, b in zip(hq["hqkv"]["hq-e8-2b"]["nll_ref"], pv["bf16"]["nll"])]),
                  nll_mean_abs_diff_vllm_stock_vs_bf16_rows=mean([abs(a - b) for a, b in zip(pv["vllm stock"]["nll"], pv["bf16"]["nll"])]),
                  top1_vllm_stock_vs_bf16_rows=vl["summary"]["vllm stock"]["top1_vs_bf16"])
    out = dict(model=hq["model"], text=hq["text"], window_tokens=len(hq["ids"]), chunk=hq["chunk"], scored_positions=n,
               vllm_sliding_format=vl.get("sliding_format"),
               note="variants named +window:S:R keep a sequence's first S and latest R tokens exact on both sides, the others no window; each side's oracle is its own bf16 rows; "
                    "hqkv's HF cache leaves sliding-window layers to transformers (exact), vLLM keeps them in `vllm_sliding_format` pages",
               oracle=oracle, rows=rows, hqkv_seconds=hq["seconds"], vllm_seconds={k: s["seconds"] for k, s in vl["summary"].items()})
    Path(out_path).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))

if __name__ == "__main__":
    main(*sys.argv[1:4])
