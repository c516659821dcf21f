"""Does a re-quantized GGUF file flatten llama.cpp's batch cost curve on this CPU? t(n) / t(1) of several files.

The shipped Q4_K_M keeps the output head and half the ``attn_v`` / ``ffn_down`` tensors in Q6_K,
for which x86 has no batched (repacked) kernel; Q4_0, IQ4_NL and Q4_K do. This script writes
re-quantized files from a GGUF file (``--write``: pure Q4_0, pure IQ4_NL, pure Q4_K with a Q8_0
head and embedding; llama.cpp re-quantizes the already quantized weights, so their quality is
below a quantization from the original weights: only their cost is measured here) and times the
engine's verify passes (``goose.cycle.calibration.measure``: chain trees over a 256-token context,
the readout included) on each file, the files taking turns round by round so that a slow spell
of the machine hits all of them; each size's median over the rounds is printed as t(n) / t(1).

    python scripts/llama_layouts.py --write /tmp/layouts --threads 2
    python scripts/llama_layouts.py --files a.gguf b.gguf --threads 2 --rounds 5 --json out.json

Run it alone on the machine: the figures are wall-clock times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from goose.cycle.calibration import measure
from goose.llama_model import LlamaModel, bindings
from goose.models import gguf_path
from goose.planning.machine import cpu_count

SIZES = (1, 2, 4, 7, 8, 11, 12, 15, 16, 24, 32)
# name -> (llama_ftype, head and embedding type or None): every tensor in the ftype's base type ("pure")
LAYOUTS = {"q4_0": ("LLAMA_FTYPE_MOSTLY_Q4_0", None), "iq4_nl": ("LLAMA_FTYPE_MOSTLY_IQ4_NL", None),
           "q4_k-q8_0-head": ("LLAMA_FTYPE_MOSTLY_Q4_K_M", "GGML_TYPE_Q8_0")}


def write_layouts(source: Path, folder: Path, threads: int) -> list[Path]:
    """The re-quantized files of :data:`LAYOUTS` in ``folder`` (kept when already there)."""
    llama = bindings()
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (ftype, head) in LAYOUTS.items():
        target = folder / f"{source.stem}-{name}.gguf"
        if not target.is_file():
            params = llama.llama_model_quantize_default_params()
            params.nthread, params.ftype = threads, getattr(llama, ftype)
            params.pure = params.allow_requantize = True
            if head is not None:
                params.output_tensor_type = params.token_embedding_type = getattr(llama, head)
            print(f"writing {target} ...", file=sys.stderr, flush=True)
            if llama.llama_model_quantize(str(source).encode(), str(target).encode(), params) != 0:
                raise SystemExit(f"llama_model_quantize failed for {target}")
        written.append(target)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="the embedded model whose shipped file leads")
    parser.add_argument("--files", nargs="*", default=[], help="more GGUF files to measure beside it")
    parser.add_argument("--write", type=Path, help="write the re-quantized layouts into this folder and measure them")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: this process's CPUs)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each file measured once a round")
    parser.add_argument("--json", type=Path, help="write every file's medians here")
    args = parser.parse_args()
    threads = args.threads or cpu_count()
    shipped = gguf_path(args.model)
    files = [shipped, *map(Path, args.files)]
    if args.write:
        files += write_layouts(shipped, args.write, threads)
    models = {path: LlamaModel(path, threads=threads) for path in files}
    seconds: dict[Path, list[tuple[float, ...]]] = {path: [] for path in files}
    for round_index in range(args.rounds):
        for path, model in models.items():
            curve = measure(model, SIZES, rounds=1)
            seconds[path].append(tuple(curve.meta.raw_seconds))
        print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    report = {}
    print(f"{threads} threads; t(n) / t(1) for n = {', '.join(map(str, SIZES))}")
    for path, runs in seconds.items():
        medians = [statistics.median(run[i] for run in runs) for i in range(len(SIZES))]
        ratios = [m / medians[0] for m in medians]
        report[path.name] = {"bytes": path.stat().st_size, "sizes": SIZES, "seconds": medians, "ratios": ratios}
        print(f"{path.name} ({path.stat().st_size / 1e6:.0f} MB): t(1) {medians[0] * 1e3:.1f} ms; "
              + ", ".join(f"{r:.2f}" for r in ratios))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
