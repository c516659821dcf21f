"""What quantized weights buy a verify pass on this machine: torch's own int4 and int8 kernels.

llama.cpp decodes the 1.5B model's Q4_K_M file several times faster than our bfloat16 loop on a
CPU; the question this script answers is how far quantized weights through torch's public kernels
close that gap: `_weight_int4pack_mm_for_cpu` (group-wise int4 with a scale and a zero per 32
weights, the layout of a Q4_K sub-block), `_weight_int8pack_mm` (weight-only int8 per output
channel) and `int8_rows`, goose.quantize's Int8Linear (`--quantize int8`: int8 weights against
activations quantized per row, through oneDNN's `qlinear_pointwise`, the row quantization and
scaling included). It times one decoder layer's seven projections and the output layer, with the
model's own shapes, at 1 to 32 rows (a tree's nodes), against bfloat16 `F.linear`, and prints the
pass's projected matmul time (layers x count + output layer) and the same for one layer alone. A
tree pays off only where rows are cheap beside the first, so the column to read is each kernel's
cost at n rows over its cost at one.

    python scripts/quant_kernels.py --model qwen2.5-coder-1.5b --threads 2 --out kernels.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoConfig

from goose.models import pretrained_location
from goose.quantize import Int8Linear

GROUP = 32  # a Q4_K sub-block: 32 weights share a scale and a minimum


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def kernels(n_out: int, n_in: int) -> dict[str, Callable[[torch.Tensor], object]]:
    """The four ways to multiply activations [rows, n_in] by one (n_out, n_in) weight, its forms built once."""
    weight = torch.randn(n_out, n_in, dtype=torch.bfloat16)
    nibbles = torch.randint(0, 16, (n_out, n_in), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(nibbles, 8)
    del nibbles
    scales_and_zeros = torch.randn(n_in // GROUP, n_out, 2, dtype=torch.bfloat16)
    int8 = torch.randint(-127, 128, (n_out, n_in), dtype=torch.int8)
    channel_scales = torch.rand(n_out, dtype=torch.bfloat16)
    rows = Int8Linear(torch.nn.Linear(n_in, n_out, bias=False))
    return {
        "bf16": lambda x: torch.nn.functional.linear(x, weight),
        "int4": lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, scales_and_zeros),
        "int8": lambda x: torch.ops.aten._weight_int8pack_mm(x, int8, channel_scales),
        "int8_rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2,4,8,16,32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    config = AutoConfig.from_pretrained(pretrained_location(args.model))
    hidden, inner = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    # q, k, v, o, gate, up, down
    layer = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden)]
    layer += [(inner, hidden), (inner, hidden), (hidden, inner)]
    head = (config.vocab_size, hidden)
    rows = [int(r) for r in args.rows.split(",")]

    # every shape's weights built once (the output layer's are the size of the vocabulary), timed at every row count
    names = ("bf16", "int4", "int8", "int8_rows")
    table: dict[str, dict[int, float]] = {name: dict.fromkeys(rows, 0.0) for name in names}
    layer_table: dict[str, dict[int, float]] = {name: dict.fromkeys(rows, 0.0) for name in names}  # one layer
    shapes = [(shape, config.num_hidden_layers, args.repeats) for shape in layer]
    shapes.append((head, 1, max(3, args.repeats // 2)))
    for (n_out, n_in), count, repeats in shapes:
        for name, fn in kernels(n_out, n_in).items():
            for n in rows:
                x = torch.randn(n, n_in, dtype=torch.bfloat16)
                seconds = median_seconds(lambda fn=fn, x=x: fn(x), repeats)
                table[name][n] += count * seconds
                if count > 1:
                    layer_table[name][n] += seconds
        print(f"  ({n_out}, {n_in}) x {count}: timed at {args.rows} rows", flush=True)

    for title, times, digits in (("matmul time of one pass", table, 0), ("one decoder layer's seven projections",
                                                                         layer_table, 2)):
        print(f"\n{title}, {args.model}, {args.threads} threads; relative to the same kernel at one row")
        print("| rows | " + " | ".join(times) + " |")
        print("|---|" + "---|" * len(times))
        for n in rows:
            cells = [f"{times[k][n] * 1e3:.{digits}f} ms ({times[k][n] / times[k][rows[0]]:.2f}x)" for k in times]
            print(f"| {n} | " + " | ".join(cells) + " |")
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "threads": args.threads, "seconds": table,
                                        "layer_seconds": layer_table}, indent=1))


if __name__ == "__main__":
    main()
