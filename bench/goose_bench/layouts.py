"""``goose bench layouts``: a GGUF file re-quantized into layouts whose every tensor has a batched x86 kernel,
measured beside the file as shipped: the cost of a pass of n rows over one row's, and the perplexity.

The shipped Qwen2.5-Coder-1.5B Q4_K_M keeps its output head and half its ``attn_v`` / ``ffn_down``
tensors in Q6_K, for which llama.cpp has no batched (repacked) x86 kernel, so a speculation tree costs
nearly in proportion to its rows. Q4_0, IQ4_NL and Q4_K have one. Each layout of :data:`LAYOUTS` is
written by llama.cpp's ``llama_model_quantize`` from the shipped file (every tensor in the layout's
base type, "pure"; ``q4_k-q8_0-head`` the head and embedding in Q8_0), into ``--out``, and kept there:
a later run measures it again without writing it. llama.cpp re-quantizes the already quantized
weights, so a written file's quality is below a quantization from the original weights; the
perplexity says by how much.

The cost: :func:`goose.cycle.calibration.measure` (the engine's verify passes, chain trees over a
256-token context, the readout included) on every file at :data:`SIZES`, the files taking turns round
by round so that a slow spell of the machine hits all of them; each size keeps its median over the
rounds. The perplexity: the same token windows for every file, cut from the Python standard
library's ``argparse`` and ``difflib`` sources (their text is this interpreter's), each window
evaluated from an empty cache in one pass, token i + 1 scored by the log softmax (float64) of the
logits at i; no BOS is added. Both run on the engine's own contexts (flash attention, a bfloat16 V
cache: ``goose.llama_model``), so the figures are those of the files as ``--engine llama.cpp`` runs them.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Any

DEFAULT_MODEL = "qwen2.5-coder-1.5b"
DEFAULT_OUT = "goose-bench-layouts"
LAYOUTS_FILE, PLOT_FILE = "layouts.json", "layouts.png"
SIZES = (1, 2, 4, 7, 8, 11, 12, 15, 16, 24, 32)  # around the repacked kernels' blocks of 4 and 8 rows
SHOWN = (4, 8, 16)  # the table's t(n) / t(1)
# name -> (llama_ftype, the head's and embedding's ggml type or None): every other tensor in the ftype's base type
LAYOUTS = {"q4_0": ("LLAMA_FTYPE_MOSTLY_Q4_0", None), "iq4_nl": ("LLAMA_FTYPE_MOSTLY_IQ4_NL", None),
           "q4_k-q8_0-head": ("LLAMA_FTYPE_MOSTLY_Q4_K_M", "GGML_TYPE_Q8_0")}
# seconds llama_model_quantize took per GB of the shipped Qwen2.5-Coder-1.5B Q4_K_M (1.12 GB) on 2 threads of
# the AVX-512 EPYC: IQ4_NL searches its scales, the others do not (5 s, 10 s, 433 s)
WRITE_SECONDS_PER_GB = {"q4_0": 5, "q4_k-q8_0-head": 9, "iq4_nl": 390}
TEXT_MODULES = ("argparse", "difflib")
WINDOWS, WINDOW_TOKENS = 8, 512
LOGITS_ROWS = 64  # rows of logits turned into float64 at a time (the 1.5B model's vocabulary is 152k)


def layout_names(text: str | None) -> list[str]:
    """``--layouts``: the comma-separated names, checked against :data:`LAYOUTS`."""
    names = [part.strip() for part in (text or "").split(",") if part.strip()]
    if not names or not set(names) <= set(LAYOUTS):
        raise ValueError(f"--layouts takes names from {', '.join(LAYOUTS)}; got {text!r}")
    return list(dict.fromkeys(names))


def check_model(model: str) -> None:
    """Refuse, before anything loads, a model without a GGUF file, and a missing llama-cpp-python."""
    from goose.models import has_gguf

    if importlib.util.find_spec("llama_cpp") is None:
        raise ValueError("goose bench layouts runs llama.cpp: llama-cpp-python is not installed here "
                         "(`make llama-setup` builds it for this CPU)")
    if not has_gguf(model):
        raise ValueError(f"goose bench layouts: {model} has no GGUF file (an embedded model or a .gguf path has one)")


def _llama() -> Any:
    # imported once goose.models.load_gguf has loaded a model: goose has checked the build against this CPU and
    # initialised the backend, and routes the library's log
    import llama_cpp

    return llama_cpp


def layout_path(source: Path, out: Path, layout: str) -> Path:
    return out / f"{source.stem}-{layout}.gguf"


def write_layout(source: Path, target: Path, layout: str, threads: int) -> bool:
    """Write ``source`` re-quantized into ``layout`` at ``target`` (through a temporary name: an interrupted write
    leaves no file that a later run would keep); False where ``target`` is already there."""
    if target.is_file():
        return False
    llama = _llama()
    ftype, head = LAYOUTS[layout]
    params = llama.llama_model_quantize_default_params()
    params.nthread, params.ftype = threads, getattr(llama, ftype)
    params.pure = params.allow_requantize = True
    if head is not None:
        params.output_tensor_type = params.token_embedding_type = getattr(llama, head)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    if llama.llama_model_quantize(str(source).encode(), str(partial).encode(), params) != 0:
        partial.unlink(missing_ok=True)
        raise ValueError(f"llama.cpp could not write {target} from {source}")
    os.replace(partial, target)
    return True


def text_windows(model: Any, count: int, size: int) -> list[list[int]]:
    """``count`` windows of ``size`` tokens of :data:`TEXT_MODULES`' sources, as ``model``'s vocabulary encodes
    them: the text cut into consecutive windows, ``count`` of them taken evenly spread from first to last."""
    llama = _llama()
    data = "\n\n".join(inspect.getsource(importlib.import_module(name)) for name in TEXT_MODULES).encode()
    buffer = (llama.llama_token * (len(data) + 16))()
    found = llama.llama_tokenize(model.vocab, data, len(data), buffer, len(buffer), False, False)
    if found < 0:
        raise ValueError(f"llama.cpp could not tokenize the text of {', '.join(TEXT_MODULES)}")
    tokens = list(buffer[:found])
    available = len(tokens) // size
    if count < 1 or size < 2 or count > available:
        raise ValueError(f"the text holds {len(tokens)} tokens: {available} windows of {size}; asked for {count}")
    picked = [round(i * (available - 1) / (count - 1)) if count > 1 else 0 for i in range(count)]
    return [tokens[i * size:(i + 1) * size] for i in picked]


def window_nll(model: Any, window: Sequence[int]) -> float:
    """The negative log likelihood of ``window``'s tokens after the first, each given those before it: one pass from
    an empty cache, every row's logits read, the log softmax in float64."""
    import numpy as np

    llama = _llama()
    context = model.new_context(len(window), 1, batch=len(window))
    batch = llama.llama_batch_init(len(window), 0, 1)
    try:
        for i, token in enumerate(window):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, i, 1, True
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(window)
        if llama.llama_decode(context, batch) != 0:
            raise ValueError(f"llama.cpp could not evaluate a window of {len(window)} tokens on {model.name}")
        logits = np.ctypeslib.as_array(llama.llama_get_logits(context), shape=(len(window), model.vocab_size))
        targets = np.asarray(window[1:])
        total = 0.0
        for start in range(0, len(targets), LOGITS_ROWS):  # row i scores token i + 1; the last row scores nothing
            stop = min(start + LOGITS_ROWS, len(targets))
            rows = logits[start:stop].astype(np.float64)
            top = rows.max(axis=1)
            norm = np.log(np.exp(rows - top[:, None]).sum(axis=1)) + top
            total += float((norm - rows[np.arange(stop - start), targets[start:stop]]).sum())
        return total
    finally:
        llama.llama_batch_free(batch)
        llama.llama_free(context)


def threads_phrase(threads: int) -> str:
    return f"{threads} thread{'s' if threads != 1 else ''}"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _say(progress: bool, text: str) -> None:
    if progress:
        print(text, file=sys.stderr, flush=True)


def run_layouts(model: str, layouts: Sequence[str], out: Path, *, threads: int | None = None, rounds: int = 5,
                windows: int = WINDOWS, window_tokens: int = WINDOW_TOKENS, progress: bool = True) -> dict[str, Any]:
    """Write ``layouts`` of ``model``'s GGUF file into ``out`` (kept where there), measure every file's curve and
    perplexity, write ``layouts.json`` (and ``layouts.png`` where matplotlib is installed); the document."""
    from goose.cycle.calibration import measure
    from goose.models import load_gguf
    from goose.planning import machine

    check_model(model)
    layout_names(",".join(layouts))
    if rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {rounds}")
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be positive, got {threads}")
    threads = threads or machine.cpu_count()
    shipped, _ = load_gguf(model, threads=threads, context=max(window_tokens, 512))
    windows_ids = text_windows(shipped, windows, window_tokens)  # a bad count fails before anything is written
    files: dict[str | None, Any] = {None: shipped}
    for layout in layouts:
        target = layout_path(shipped.path, out, layout)
        if target.is_file():
            _say(progress, f"keeping {target}")
        else:  # minutes for a 1.5B model's IQ4_NL: said before the wait
            seconds = WRITE_SECONDS_PER_GB[layout] * shipped.path.stat().st_size / 1e9 * 2 / threads
            print(f"writing {target} ({layout} from {shipped.path.name}; llama.cpp re-quantizes every tensor: about "
                  f"{_duration(seconds)} on {threads_phrase(threads)}, judging by a 2-core AVX-512 EPYC) ...",
                  file=sys.stderr, flush=True)
        write_layout(shipped.path, target, layout, threads)
        # the tokenizer load_gguf reads beside a file is cached in --out, not in goose's cache
        files[layout] = load_gguf(str(target), threads=threads, context=max(window_tokens, 512),
                                  cache_dir=out / ".cache")[0]
    wrong = [str(m.path) for m in files.values() if m.vocab_size != shipped.vocab_size]
    if wrong:
        raise ValueError(f"{', '.join(wrong)}: another vocabulary than {shipped.path}'s")
    samples: dict[str | None, list[tuple[float, ...]]] = {layout: [] for layout in files}
    for round_index in range(rounds):
        for layout, loaded in files.items():
            samples[layout].append(tuple(measure(loaded, SIZES, rounds=1).seconds))
        _say(progress, f"cost: round {round_index + 1}/{rounds} of {len(files)} files done")
    entries = []
    for layout, loaded in files.items():
        seconds = [median(run[i] for run in samples[layout]) for i in range(len(SIZES))]
        nll = [window_nll(loaded, window) for window in windows_ids]
        scored = sum(len(window) - 1 for window in windows_ids)
        entries.append({"layout": layout, "file": loaded.path.name, "path": str(loaded.path),
                        "description": loaded.description, "bytes": loaded.path.stat().st_size, "seconds": seconds,
                        "ratios": [s / seconds[0] for s in seconds],
                        "perplexity": math.exp(sum(nll) / scored),
                        "window_perplexities": [math.exp(v / (len(w) - 1)) for v, w in zip(nll, windows_ids,
                                                                                            strict=True)]})
        _say(progress, f"perplexity of {loaded.path.name}: {entries[-1]['perplexity']:.4f}")
    base = entries[0]
    for entry in entries:
        entry["t16_in_shipped_t1"] = entry["seconds"][SIZES.index(16)] / base["seconds"][0]
        entry["perplexity_change"] = entry["perplexity"] / base["perplexity"] - 1
    document = {
        "conditions": {"engine": f"llama.cpp via llama-cpp-python {_llama().__version__}", "threads": threads,
                       "rounds": rounds, "sizes": list(SIZES), "cpu": machine.cpu_model(),
                       "cpu_features": machine.describe_features(), "model": model,
                       "ggml_cpu_tiled_mm": os.environ.get("GGML_CPU_TILED_MM"),
                       "text": {"modules": list(TEXT_MODULES), "python": sys.version.split()[0],
                                "windows": windows, "window_tokens": window_tokens,
                                "scored_tokens": sum(len(w) - 1 for w in windows_ids)}},
        "files": entries,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / LAYOUTS_FILE).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    try:
        from goose_bench.plots import layouts_plot

        conditions = document["conditions"]
        layouts_plot(document, out / PLOT_FILE, f"{Path(entries[0]['file']).stem}: "
                     f"{threads_phrase(conditions['threads'])}, {conditions['cpu']}")
    except ImportError as error:  # matplotlib: goose-bench's dependency, but an environment may lack it
        print(f"no plot: {error}", file=sys.stderr)
    return document


def layouts_table(document: dict[str, Any]) -> str:
    """The files side by side, the shipped one first: size, t(1), t(n) / t(1), t(16) in the shipped file's t(1),
    perplexity and its change."""
    sizes = document["conditions"]["sizes"]
    header = ["file", "MB", "t(1) ms", *(f"t({n})/t(1)" for n in SHOWN), "t(16) in shipped t(1)", "perplexity",
              "vs shipped"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for entry in document["files"]:
        name = f"{entry['file']} ({entry['layout'] or 'as shipped'})"
        change = f"{entry['perplexity_change']:+.1%}" if entry["layout"] else "–"
        lines.append("| " + " | ".join([
            name, f"{entry['bytes'] / 1e6:.0f}", f"{entry['seconds'][0] * 1e3:.2f}",
            *(f"{entry['ratios'][sizes.index(n)]:.2f}" for n in SHOWN), f"{entry['t16_in_shipped_t1']:.2f}",
            f"{entry['perplexity']:.3f}", change]) + " |")
    return "\n".join(lines)
