"""Where batching stops paying for drafting on this device: the most batched Goose can gain over batched ``ar``.

A batched pass of B requests with R rows each costs t_B(B x R), where t_B is the batch size's own
measured cost curve (``goose.planning.cost.BatchCosts``, the curve the batched planner prices with).
Batched ``ar`` pays t_B(B) for B tokens; batched Goose pays t_B(B x R) for B x tau(R) tokens. So,
with every row's tree as good as one request's alone, no padding (every row as wide as its own
tree), no host time and no prefill, batched Goose gains at most

    tau(R) x t_B(B) / t_B(B x R)        over batched ``ar``.

This script measures tau(R) and each pass's rows by decoding the prompts one request at a time in
float32 (every configuration decodes the same text, so the figures are the budgets' own), at fixed
budgets and with the automatic budget planned on the batch's curve as if every row paid for B rows
(what the batched split does when the rows are alike), and prints that ceiling per batch size:

    python scripts/batching_bound.py --batches 1,2,4,8 --limit 2 --max-new-tokens 128

The curves are read from the calibration cache for the model in ``--curve-dtype`` (measured there on
first use, as ``goose bench --concurrency`` does). A ceiling below 2 at batch 4 means no planner can
meet a 2x target on this device: the rows a tree needs cost what the batch's other requests cost.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from goose.bench.prompts import load_samples
from goose.config import GooseConfig
from goose.cycle.calibration import load_or_measure
from goose.cycle.decoder import GooseDecoder
from goose.models import encode_prompt, load
from goose.planning.cost import BatchCosts, CostCurve

BATCH_DATASETS = "humaneval,mbpp,classeval,gsm8k,mt_bench"


def per_row_curve(batch_curve: CostCurve, batch: int) -> CostCurve:
    """t(R) = t_B(B x R): what one row's tree of R rows costs when every row of the batch is as wide."""
    widths = np.unique(np.concatenate([[1], np.geomspace(1, 256, 17).round()])).astype(int)
    return CostCurve(tuple(int(w) for w in widths), tuple(float(x) for x in batch_curve(batch * widths)))


def ceiling(runs: list[tuple[int, list[int]]], batch_curve: CostCurve, batch: int) -> float:
    """Tokens per second of the runs' passes priced at batch ``batch``, over batched ``ar``'s (one row a pass)."""
    tokens = sum(n for n, _ in runs)
    seconds = sum(float(np.sum(batch_curve(batch * np.asarray(sizes)))) for _, sizes in runs)
    return tokens * float(batch_curve(batch)) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--datasets", default=BATCH_DATASETS)
    parser.add_argument("--limit", type=int, default=2, help="prompts per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--budgets", default="1,2,3,4,6,8,12,16,32")
    parser.add_argument("--curve-dtype", default="bfloat16", help="the dtype whose cost curves price the passes")
    parser.add_argument("--out", type=Path, help="write the table as JSON here")
    args = parser.parse_args()

    torch.set_num_threads(2)
    batches = [int(b) for b in args.batches.split(",")]
    budgets = [int(b) for b in args.budgets.split(",")]
    timed, _ = load(args.model, dtype=args.curve_dtype, progress=False)
    costs = BatchCosts(load_or_measure(timed), lambda batch, model=timed: load_or_measure(model, batch=batch))
    curves = {batch: costs.curve(batch) for batch in batches}  # measured once per machine, then cached
    del timed
    model, tokenizer = load(args.model, dtype="float32", progress=False)
    samples = [s for dataset in args.datasets.split(",") for s in load_samples(dataset, limit=args.limit)]
    prompts = [encode_prompt(tokenizer, sample.turns[0]) for sample in samples]

    configs: dict[str, tuple[GooseConfig, CostCurve | None]] = {
        f"B={budget}": (GooseConfig(budget=budget), None) for budget in budgets}
    for batch in batches:
        configs[f"auto@{batch}"] = (GooseConfig(), per_row_curve(curves[batch], batch))
    runs: dict[str, list[tuple[int, list[int]]]] = {}
    texts: dict[str, list[list[int]]] = {}
    with tqdm(total=len(configs) * len(prompts), unit="gen") as progress:
        for name, (config, curve) in configs.items():
            decoder = GooseDecoder(model, tokenizer, config, cost_curve=curve or curves[1])
            runs[name], texts[name] = [], []
            for prompt_ids in prompts:
                progress.set_postfix_str(name)
                with torch.inference_mode():
                    result = decoder.generate(prompt_ids, args.max_new_tokens)
                decoder.verifier.reset()
                runs[name].append((len(result.new_token_ids), list(result.stats.tree_sizes)))
                texts[name].append(result.new_token_ids)
                progress.update()
    reference = next(iter(texts.values()))
    identical = all(t == reference for t in texts.values())

    print(f"\n{args.model}, {len(prompts)} prompts, {args.max_new_tokens} tokens, float32 texts "
          f"{'identical across configurations' if identical else 'DIFFER'}; passes priced by the "
          f"{args.curve_dtype} batch curves")
    print(f"{'config':10s} {'tau':>5s} {'rows':>5s}  " + " ".join(f"{f'batch {b}':>8s}" for b in batches))
    table = []
    for name, rows in runs.items():
        tokens = sum(n for n, _ in rows)
        passes = [size for _, sizes in rows for size in sizes]
        row = {"config": name, "tau": tokens / len(passes), "mean_rows": float(np.mean(passes)),
               "ceiling": {b: ceiling(rows, curves[b], b) for b in batches}}
        table.append(row)
        print(f"{name:10s} {row['tau']:5.2f} {row['mean_rows']:5.1f}  "
              + " ".join(f"{row['ceiling'][b]:7.2f}x" for b in batches))
    best = {b: max(table, key=lambda r: r["ceiling"][b]) for b in batches}
    print("best:      " + "  ".join(f"batch {b}: {best[b]['ceiling'][b]:.2f}x ({best[b]['config']})" for b in batches))
    for batch in batches:
        curve = curves[batch]
        print(f"t_{batch}(rows) ms: " + " ".join(f"{r}:{1000 * float(curve(r)):.0f}"
                                                 for r in batch * np.array([1, 2, 4, 8, 16, 32])))
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "prompts": len(prompts),
                                        "max_new_tokens": args.max_new_tokens, "identical": identical,
                                        "curves": {b: curves[b].to_dict() for b in batches}, "rows": table},
                                       indent=1))


if __name__ == "__main__":
    main()
