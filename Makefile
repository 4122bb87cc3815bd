# Set-up and everyday commands. `make test` and `make demo` work on a fresh machine.
# GPU machines: `make install GPU=1` (vLLM's CUDA build and its CUDA torch, pinned by
# constraints-gpu.txt; docs/gpu.md). The venv remembers which install it holds, so later
# `make test` / `make demo` keep it; switching needs `make clean` first.
# TORCH_INDEX=URL: the index the CPU torch (2.13.0+cpu, not on PyPI) comes from, where pip
# is not already set up to find it: https://download.pytorch.org/whl/cpu
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
GPU ?= $(if $(wildcard $(VENV)/.installed-gpu),1,)
ifeq ($(GPU),1)
KIND := gpu
STAMP := $(VENV)/.installed-gpu
OTHER_STAMP := $(VENV)/.installed
else
KIND := cpu
STAMP := $(VENV)/.installed
OTHER_STAMP := $(VENV)/.installed-gpu
endif
CONSTRAINTS ?= constraints-$(KIND).txt
DEMO_ARGS ?=
# `make soak SOAK_ARGS="--duration 120"`: a soak of the whole loop with faults (docs/soak.md)
SOAK_ARGS ?=
# `make test` runs the suite on TEST_WORKERS pytest-xdist workers (0: one process, serially);
# tests/conftest.py keeps what must not overlap on one worker
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

.PHONY: install test test-fast lint demo soak docs clean

$(STAMP): pyproject.toml $(CONSTRAINTS) ops/install.sh
	@if [ -e $(OTHER_STAMP) ]; then echo "$(VENV) holds the other install ($(OTHER_STAMP)): make clean first" >&2; exit 1; fi
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# the steps (shared with the images): ops/install.sh
	PIP="$(PIP)" CONSTRAINTS=$(CONSTRAINTS) TORCH_INDEX="$(TORCH_INDEX)" \
		bash ops/install.sh $(KIND) --editable --dev
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest $(XDIST) -m "not slow and not integration" $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

demo: $(STAMP)
	$(VENV)/bin/autospec demo $(DEMO_ARGS)

soak: $(STAMP)
	$(VENV)/bin/autospec bench soak $(SOAK_ARGS)

docs: $(STAMP)
	$(PY) scripts/gen_cli_docs.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
