"""A GGUF file as shipped, loaded by llama.cpp: the model of the ``llama.cpp`` engine (``--engine llama.cpp``).

llama-cpp-python's public low-level bindings (``llama_cpp.llama_model_load_from_file`` and
friends) load the file with its quantized weights; :mod:`goose.cycle.llama_verifier` verifies
Goose's trees on it. Nothing here imports ``llama_cpp`` until a model is loaded, so ``import goose``
never needs it; a missing or broken installation is a :class:`LlamaEngineError` saying how to get it,
and so is a build for another CPU: ``make llama-setup`` records the instruction sets its build needs
(:func:`cpu_flags_file`), and one this CPU lacks is refused before the library loads (goose.cpu), never
a SIGILL.

llama.cpp logs to stderr from C; its lines go to the ``goose.llama`` logger instead (debug level),
and the last warning and error lines are kept for the message of a failed call.

Every context is made so that a row's attention does not depend on the pass it rides in, so that a tree's
rows are the rows of llama.cpp's own one-token decoding wherever the matmuls round a row alike in any pass.
On SmolLM2's Q4_1 file they are, bit for bit (tests/test_llama_exactness.py compares chains of 2 to 8 rows
and branching trees with ``np.array_equal``). Not on every file: where a batched kernel takes a pass's
rows (ggml's repacked x86 GEMM takes them in fours) it may round them otherwise than the one-row kernel:
on Qwen2.5-Coder-1.5B Q4_K_M a pass of 4 rows or more parted from the one-token rows by up to 0.63
logits (2 rows: equal; 2 threads, the AVX-512 EPYC), and Goose's output may part from ``ar``'s at a
near-tie of that size there. The settings:

- flash attention on (llama.cpp's default on a CPU is ``auto``, which takes it; llama-cpp-python's
  ``Llama`` turns it off unless asked), with the V cache in bfloat16. ggml's CPU flash attention
  sums a row's values in half precision when V is float16, and it picks its path by the pass's
  shape: a one-row pass over 512 cells or more splits the cells among the threads, a pass of
  more rows does not, so a one-token pass and a tree's row summed the same values in another
  order and parted by up to 1.3 logits (SmolLM2). With a V cache in any other type it sums in
  float32 and takes the same path for every pass.
- ggml's tiled K-quant matmul off (``GGML_CPU_TILED_MM=0``, its own switch, unless the environment
  sets it): it is taken from 8 rows on and rounds otherwise than the stock path, and on the 2-core
  AMD EPYC of docs/results.md it made a pass of 8 to 24 rows 15-35% dearer (Qwen2.5-Coder-1.5B
  Q4_K_M). It changes no pass of one row. The cost curve's cache key records it.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import sys
from collections import deque
from pathlib import Path
from typing import Any

from goose import cpu
from goose.planning.cost import cpu_name
from goose.planning.machine import cpu_count

logger = logging.getLogger("goose.llama")

ENGINE = "llama.cpp"
DEFAULT_CONTEXT = 8192  # positions a request may hold (prompt and output) unless the file's training context is less


class LlamaEngineError(ValueError):
    """llama.cpp is missing, or refused a file or a call; the message is one line that says why."""


_state: dict[str, Any] = {}  # the binding, loaded once per process, and the log callback it keeps
_recent_errors: deque[str] = deque(maxlen=8)


TILED_SWITCH = "GGML_CPU_TILED_MM"
# The sizes a cost curve on this engine is measured at: every row count to 32. Its quantized matmuls take
# rows in blocks, so t(n) steps rather than grows smoothly (Qwen2.5-Coder-1.5B Q4_K_M, 2 threads, AMD EPYC
# with AVX-512: 15 rows cost 9.03 tokens' time, 16 rows 7.44), and a curve interpolated between a few sizes
# would hide where a row more is cheaper; the planner's budgets land on these sizes.
CALIBRATION_SIZES = (*range(1, 33), 48, 64, 96, 128)
CELL_PADDING = 256  # llama.cpp rounds a context's cells up to a multiple of this
GGML_TYPE_BF16 = 30  # ggml.h's enum ggml_type (llama-cpp-python names no constant for it)
GGML_LOG_WARN, GGML_LOG_ERROR = 3, 4  # ggml.h's enum ggml_log_level
CPU_FLAGS_VARIABLE = "GOOSE_LLAMA_CPU_FLAGS"
CPU_FLAGS_FILE = "goose-llama-cpu-flags"  # written into the environment by `make llama-setup`


def cpu_flags_file() -> Path:
    """Where the installed llama-cpp-python's build recorded the instruction sets it needs: ``$GOOSE_LLAMA_CPU_FLAGS``,
    else ``goose-llama-cpu-flags`` in this environment (``.venv``)."""
    return Path(os.environ.get(CPU_FLAGS_VARIABLE) or Path(sys.prefix) / CPU_FLAGS_FILE)


def bindings() -> Any:
    """The ``llama_cpp`` module, its backend initialised and its log routed to the ``goose.llama`` logger."""
    if "module" in _state:
        return _state["module"]
    refused = cpu.refusal("llama-cpp-python", cpu_flags_file(), "make llama-setup")
    if refused:  # loading it would die with SIGILL at its first instruction this CPU lacks
        raise LlamaEngineError(refused)
    os.environ.setdefault(TILED_SWITCH, "0")  # read by ggml at its first matmul (see the module's docstring)
    try:
        import llama_cpp
    except ImportError as error:
        raise LlamaEngineError(f"--engine llama.cpp needs llama-cpp-python ({error}); `make llama-setup` builds it "
                               "for this CPU") from None
    except OSError as error:  # the shared library would not load (built for another CPU)
        raise LlamaEngineError(f"llama-cpp-python's library does not load here: {error}; rebuild it with "
                               "`make llama-setup`") from None

    @llama_cpp.llama_log_callback
    def route(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        line = text.decode("utf-8", errors="replace").rstrip()
        if level in (GGML_LOG_WARN, GGML_LOG_ERROR) and line:
            _recent_errors.append(line)
        if line:
            logger.debug("%s", line)

    llama_cpp.llama_log_set(route, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    _state["module"], _state["callback"] = llama_cpp, route  # the callback must outlive every call
    return llama_cpp


def recent_errors() -> str:
    """llama.cpp's last warning and error lines (since the last call of this function), as one line."""
    text = " | ".join(_recent_errors)
    _recent_errors.clear()
    return text


class LlamaModel:
    """The weights of one GGUF file in llama.cpp, and what a verifier needs to know of them.

    ``threads``: llama.cpp's threads for every context of this model (default: the CPUs this process may run on,
    its affinity: a container's or taskset's share, not the host's count).
    ``context``: the positions one request may hold (default: the file's training context, at most
    :data:`DEFAULT_CONTEXT`); a context reserves its KV cache for them when it is made.
    """

    calibration_sizes = CALIBRATION_SIZES

    def __init__(self, path: str | Path, *, name: str | None = None, threads: int | None = None,
                 context: int | None = None) -> None:
        llama = bindings()
        self.path = Path(path).expanduser().resolve()
        if not self.path.is_file():
            raise LlamaEngineError(f"no GGUF file at {path}")
        self.name = name or self.path.stem
        if threads is not None and threads < 1:
            raise LlamaEngineError(f"threads must be at least 1, got {threads}")
        self.threads = threads or cpu_count()
        params = llama.llama_model_default_params()
        params.n_gpu_layers = 0  # the CPU engine: what this build was made for
        pointer = llama.llama_model_load_from_file(str(self.path).encode(), params)
        if not pointer:
            raise LlamaEngineError(f"llama.cpp could not load {self.path}: {recent_errors() or 'no reason given'}")
        self.pointer = pointer
        self.vocab = llama.llama_model_get_vocab(pointer)
        self.vocab_size = int(llama.llama_vocab_n_tokens(self.vocab))
        self.training_context = int(llama.llama_model_n_ctx_train(pointer))
        if context is not None and context < 2:
            raise LlamaEngineError(f"context must be at least 2 positions, got {context}")
        self.context = min(context or DEFAULT_CONTEXT, self.training_context)
        self.parameters = int(llama.llama_model_n_params(pointer))
        self.embedding = int(llama.llama_model_n_embd(pointer))
        self.layers = int(llama.llama_model_n_layer(pointer))
        described = ctypes.create_string_buffer(256)
        llama.llama_model_desc(pointer, described, 256)
        self.description = described.value.decode(errors="replace")
        # the tokens that end a generation in llama.cpp (EOS, EOT, <|im_end|>, ...): its own stopping rule
        self.end_ids = frozenset(t for t in range(self.vocab_size) if llama.llama_vocab_is_eog(self.vocab, t))

    def __repr__(self) -> str:
        return f"LlamaModel({self.name!r}, {self.description}, threads={self.threads})"

    def close(self) -> None:
        """Free the weights (every context made from them must be freed first)."""
        if getattr(self, "pointer", None):
            bindings().llama_model_free(self.pointer)
            self.pointer = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the bindings may be gone: the process frees it
            self.close()

    def new_context(self, positions: int, sequences: int, batch: int = 2048) -> Any:
        """A llama.cpp context of ``positions`` KV cells over ``sequences`` sequence ids, one unified KV buffer
        (a token may belong to several sequences: a tree), taking up to ``batch`` tokens a decode call."""
        llama = bindings()
        params = llama.llama_context_default_params()
        # llama.cpp pads a context to a multiple of 256 cells and then reserves outputs for the padded size, so a
        # smaller n_batch than that fails its own GGML_ASSERT (an abort, not an error): pad it here as it would
        positions = -(-positions // CELL_PADDING) * CELL_PADDING
        params.n_ctx = positions
        params.n_batch = min(batch, positions)
        params.n_ubatch = min(512, positions)
        params.n_seq_max = sequences
        params.n_threads = params.n_threads_batch = self.threads
        params.kv_unified = True
        # a row's arithmetic must not depend on the pass it rides in (see the module's docstring)
        params.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_ENABLED
        params.type_v = GGML_TYPE_BF16
        params.no_perf = True
        context = llama.llama_init_from_model(self.pointer, params)
        if not context:
            raise LlamaEngineError(f"llama.cpp could not make a context of {positions} positions and {sequences} "
                                   f"sequences for {self.name}: {recent_errors() or 'no reason given'}")
        return context

    def cache_key(self) -> str:
        """What a cost curve measured on this model is cached under: the file, the threads, the build, the CPU."""
        llama = bindings()
        stat = self.path.stat()
        build = hashlib.sha256(f"{llama.__version__}\0{llama.llama_print_system_info().decode(errors='replace')}"
                               .encode()).hexdigest()[:10]
        file = hashlib.sha256(f"{self.path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:10]
        parts = [ENGINE, self.path.stem[:60], file, f"threads{self.threads}", f"build{build}", "rows32",
                 f"tiled{os.environ.get(TILED_SWITCH, '')}", platform.machine(), cpu_name()]
        return "-".join(p.replace("/", "_").replace(" ", "_") for p in parts if p)
