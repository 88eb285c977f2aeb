# Two commands: `make demo` and `make test`. Each sets itself up first (a virtual environment
# in .venv with the pinned versions of requirements/lock.txt, lock-verl.txt and lock-vllm.txt -- vLLM's
# CPU build, installed without its unpinned torchvision/torchaudio/torchcodec -- the project installed editable).

SHELL  := /bin/bash
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test setup lock clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements/lock.txt requirements/lock-verl.txt requirements/lock-vllm.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements/lock.txt -r requirements/lock-verl.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -r requirements/lock-vllm.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mcore-dapo demo --workdir demo-out

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lock: $(STAMP)
	head -2 requirements/lock.txt > requirements/lock.txt.new
	$(BIN)/pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$$/torch==\1/' \
	  | grep -vxFf <(grep -hv '^#' requirements/lock-verl.txt requirements/lock-vllm.txt) >> requirements/lock.txt.new
	mv requirements/lock.txt.new requirements/lock.txt

clean:
	rm -rf $(VENV)
