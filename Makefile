# Two commands: `make demo` and `make test`. Each sets itself up first (a virtual environment
# with the pinned versions of the stack's lock files, the project installed editable).
#
# STACK=main   (default) .venv:        torch 2.13.0, megatron-core 0.16.1 (requirements/lock.txt + lock-verl.txt,
#                                      and lock-vllm.txt: vLLM's CPU build, installed --no-deps, without its
#                                      unpinned torchvision/torchaudio/torchcodec)
# STACK=ascend           .venv-ascend: torch 2.7.1, megatron-core 0.12.1, the Ascend line
#                                      (requirements/lock-ascend.txt); `make test` runs the tests marked
#                                      `both_stacks` there (tests/conftest.py)
# `make check-py310`: the code stays valid on Python 3.10 (vermin, pinned in the test locks): the project's
#                     code, tests and tools, not the vendored upstream sources under tests/vendor.

SHELL  := /bin/bash
PYTHON ?= python3
STACK  ?= main
PYTEST_ARGS ?=
# two pytest workers: the files that start torchrun ranks, Ray or vLLM leave part of the 2 cores idle (ranks
# waiting on each other, processes starting); the other worker fills it (tests/conftest.py, WORKER GROUPS). One
# worker a core: a third was tried and not kept (not faster, and it brought memory close to the machine's 24 GiB).
WORKERS ?= 2

ifeq ($(STACK),main)
VENV   := .venv
LOCKS  := requirements/lock.txt requirements/lock-verl.txt
NODEPS_LOCKS := requirements/lock-vllm.txt
SELECT := -m "not ascend_stack"
else ifeq ($(STACK),ascend)
VENV   := .venv-ascend
LOCKS  := requirements/lock-ascend.txt
NODEPS_LOCKS :=
SELECT := -m "both_stacks or ascend_stack"
else
$(error STACK=$(STACK) is not accepted: accepted are main, ascend)
endif

BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test setup lock clean check-py310

setup: $(STAMP)

$(STAMP): pyproject.toml $(LOCKS) $(NODEPS_LOCKS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check $(addprefix -r ,$(LOCKS))
	$(if $(NODEPS_LOCKS),$(BIN)/pip install --quiet --disable-pip-version-check --no-deps $(addprefix -r ,$(NODEPS_LOCKS)))
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mcore-dapo demo --workdir demo-out

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(WORKERS) $(SELECT) $(PYTEST_ARGS)

check-py310: $(STAMP)
	$(BIN)/vermin -q --target=3.10- --violations --no-tips --no-make-paths-absolute \
	  --exclude-regex '^tests/vendor/' mcore_dapo mcore_dapo_checks tests tools

ifeq ($(STACK),main)
lock: $(STAMP)
	head -2 requirements/lock.txt > requirements/lock.txt.new
	$(BIN)/pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$$/torch==\1/' \
	  | grep -vxFf <(grep -hv '^#' requirements/lock-verl.txt requirements/lock-vllm.txt) >> requirements/lock.txt.new
	mv requirements/lock.txt.new requirements/lock.txt
else
lock: $(STAMP)
	grep '^#' requirements/lock-ascend.txt > requirements/lock-ascend.txt.new
	$(BIN)/pip freeze --exclude-editable >> requirements/lock-ascend.txt.new
	mv requirements/lock-ascend.txt.new requirements/lock-ascend.txt
endif

clean:
	rm -rf $(VENV)
