# Two set-up commands (see README): `make book` builds the book, `make test` runs the tests.
# Each creates or reuses the project-local virtual environment .venv, installs the pinned dependencies
# (torch included), assembles and converts the embedded models once into the model cache, and runs.

PYTHON ?= python3
# The book's parameter set (params/<name>.yaml, or a YAML file); RECOMPUTE=1 re-executes the notebooks (and
# re-plans the sample); BUDGET=MINUTES sizes the default set's sample for another build time than its 40 minutes.
PARAMS ?= cpu-embedded
RECOMPUTE ?=
BUDGET ?=
# Two software stacks, each in its own virtual environment. The CPU stack (default): torch 2.13.0 and the
# embedded models' data packages, torchao for the 4-bit target of cpu-embedded-int4, Triton for running
# FlashHead's GPU kernels in its interpreter (the tests). The GPU stack (parameter sets named gpu-*): torch 2.14.1 and gptqmodel 7.7.0,
# which transformers 5 needs to load the thesis' AWQ target (gptqmodel 7.7.0 requires torch >= 2.14.1).
GPU_SET := $(filter gpu-%,$(notdir $(basename $(PARAMS))))
ifneq ($(GPU_SET),)
VENV ?= .venv-gpu
TORCH ?= torch==2.14.1
EXTRAS ?= gpu,test,book
else
VENV ?= .venv
TORCH ?= torch==2.13.0
EXTRAS ?= embedded,test,book,kernels-cpu
endif
PY := $(VENV)/bin/python
# Extra pip arguments for torch, e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
# on a CPU-only machine whose pip does not already find the CPU build.
TORCH_PIP_ARGS ?=
STAMP := $(VENV)/.thesis-lib-installed
PYTEST_ARGS ?=
# Runs a quiet command with a line every 10 s saying it goes on (pip says nothing for minutes while it downloads).
talk = ( while sleep 10; do echo "  $(1): still working"; done ) & talker=$$!; $(2); status=$$?; \
	kill $$talker 2>/dev/null; exit $$status

.PHONY: env models book read explore demo browser slurm test test-fast mutation clean-venv

env: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@echo "installing $(TORCH) and the project's dependencies into $(VENV)"
	@$(call talk,installing $(TORCH),$(PY) -m pip install --quiet $(TORCH) $(TORCH_PIP_ARGS))
	@$(call talk,installing '.[$(EXTRAS)]',$(PY) -m pip install --quiet -e '.[$(EXTRAS)]')
	@touch $@

models: $(STAMP)
	$(PY) -m thesis_lib.cli prepare

# The main job: every chapter notebook through papermill (results reused when the parameters are unchanged),
# then the Jupyter Book with warnings as errors; prints where the HTML is. The embedded models are prepared
# first only for the sets that use them (a gpu-* set fetches its hub models when a notebook needs them).
# EXECUTOR=slurm sends the runs that follow from the parameters to Slurm first (one job each, SLURM_ARGS e.g.
# "--partition gpu --time 08:00:00"; see thesis-lib book --help), waits with progress, then runs the notebooks.
# The build's start, taken when make reads this file (before the set-up steps): the planner counts the minutes the
# set-up took against the budget.
BUILD_CLOCK := THESIS_LIB_BUILD_STARTED=$(shell date +%s)
EXECUTOR ?= local
SLURM_ARGS ?=
book: $(if $(GPU_SET),$(STAMP),models)
	$(BUILD_CLOCK) $(PY) -m thesis_lib.cli book --params $(PARAMS) $(if $(RECOMPUTE),--recompute,) $(if $(BUDGET),--budget $(BUDGET),) --executor $(EXECUTOR) $(SLURM_ARGS)

# The default book from the committed run data of its reference build: nothing measured, a few minutes (the
# worked example of chapter 3 and chapter 6's calibration states still run the models).
read: models
	$(PY) -m thesis_lib.cli book --params cpu-embedded-committed

# The live explorer as a web app (Voila) on http://127.0.0.1:8866/ for the parameter set; Ctrl-C stops it.
PORT ?= 8866
explore: $(if $(GPU_SET),$(STAMP),models)
	$(PY) -m thesis_lib.cli explore --params $(PARAMS) --port $(PORT)

# Every decoding mode on the embedded pair, side by side (no book).
demo: models
	$(PY) -m thesis_lib.cli compare

# Debian's Chromium for the real-browser check of the book (installed when missing and we may).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -qq chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)) \
	      && echo "installed chromium"; \
	  else echo "no chromium: the browser check will be skipped (install Debian's chromium)"; fi; }

# Debian's Slurm and MUNGE for the real-scheduler sweep test (installed when missing and we may).
slurm:
	@command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null 2>&1 || (apt-get update -qq && \
	      apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null)) && echo "installed slurm-wlm and munge" \
	      || echo "could not install slurm-wlm and munge: the sweep test on a local Slurm cluster will be skipped"; \
	  else echo "no Slurm: the sweep test on a local Slurm cluster will be skipped (install Debian's slurm-wlm and munge)"; fi; }

test: models browser slurm
	$(PY) -m pytest $(PYTEST_ARGS)

# While developing: the loops, the heads and the kernels on tiny models (no real pair, no book), a few minutes.
FAST_TESTS = tests/test_decoding.py tests/test_flashhead.py tests/test_weight_only.py tests/test_fused.py \
  tests/test_compact.py tests/test_packing.py tests/test_attention.py
test-fast:
	$(PY) -m pytest -q -m "not real" $(FAST_TESTS) $(PYTEST_ARGS)

# Mutation testing with mutmut (pyproject's [tool.mutmut]: the files and the tests; tools/mutation_report.py's SCOPE:
# the decoding package, FlashHead, the intervals and the verdict sentences, and below the loop the dense head,
# attention, the packed, weight-only and fused layers, the compact step, the runner and the metrics); not part of
# `make test`: the whole scope takes many hours on two cores. MUTATION_SAMPLE=N checks a uniform sample of N (seeded
# by MUTATION_SEED) of the mutants no earlier sample checked instead (mutmut first generates every mutant and checks
# the first of each function of stats.py); each run is appended to data/reference/mutation-samples.json, and the
# report (data/reference/mutation-report.md) gives each sample's score over all its mutants and without those set
# aside as equivalent, with intervals, and per file. One intra-op thread: mutmut runs a process per mutant; Triton's
# interpreter for the kernel checks among the tests.
MUTATION_SAMPLE ?=
MUTATION_SEED ?= 0
MUTMUT_ENV = OMP_NUM_THREADS=1 TRITON_INTERPRET=1
mutation: models
	$(PY) -m pip install --quiet -e '.[$(EXTRAS),mutation]'
	rm -rf mutants
	if [ -z "$(MUTATION_SAMPLE)" ]; then \
	  $(PY) tools/mutation_report.py --patterns | $(MUTMUT_ENV) xargs $(VENV)/bin/mutmut run; \
	else \
	  $(MUTMUT_ENV) $(VENV)/bin/mutmut run 'thesis_lib.decoding.stats.*__mutmut_1' && \
	  $(PY) tools/mutation_report.py --sample $(MUTATION_SAMPLE) $(MUTATION_SEED) | $(MUTMUT_ENV) xargs $(VENV)/bin/mutmut run; \
	fi
	$(PY) tools/mutation_report.py --record
	$(PY) tools/mutation_report.py > data/reference/mutation-report.md
	@echo "report: data/reference/mutation-report.md"

clean-venv:
	rm -rf $(VENV)
