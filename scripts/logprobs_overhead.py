"""What asking for log probabilities costs a Goose generation: the same prompts with and without ``logprobs``.

Each prompt is generated ``--repeats`` times in each mode, alternating (off, on, on, off, ...) so that
drift on a shared machine and the decoder's learning fall on both modes alike, after one warm-up run
of each. Per prompt the median wall time of each mode, their ratio, and whether the tokens are the
same (they must be: log probabilities never change the output); the summary is the median of the
per-prompt ratios.

    python scripts/logprobs_overhead.py --dtype float32 --datasets humaneval,gsm8k,mt_bench --limit 2
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from goose import models
from goose.bench.prompts import load_samples
from goose.cycle.decoder import GooseDecoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--datasets", default="humaneval,gsm8k,mt_bench")
    parser.add_argument("--limit", type=int, default=2, help="prompts per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--logprobs", type=int, default=5, help="top alternatives per token in the 'on' runs")
    parser.add_argument("--repeats", type=int, default=4, help="runs per mode and prompt")
    parser.add_argument("--out", default=None, help="also write the per-prompt rows here as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = models.load(args.model, dtype=args.dtype, device=args.device)
    decoder = GooseDecoder(model, tokenizer)
    prompts = [sample.turns[0] for name in args.datasets.split(",") for sample in load_samples(name, limit=args.limit)]
    rows = []
    for index, prompt in enumerate(prompts):
        options = {"off": {}, "on": {"logprobs": args.logprobs}}
        tokens = {mode: decoder.generate(prompt, args.max_new_tokens, **extra).new_token_ids  # warm-up
                  for mode, extra in options.items()}
        times: dict[str, list[float]] = {"off": [], "on": []}
        for repeat in range(args.repeats):
            order = ("off", "on") if repeat % 2 == 0 else ("on", "off")
            for mode in order:
                result = decoder.generate(prompt, args.max_new_tokens, **options[mode])
                times[mode].append(result.stats.wall_s)
                assert result.new_token_ids == tokens[mode]
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        row = {"prompt": index, "new_tokens": len(tokens["off"]), "off_s": round(off, 4), "on_s": round(on, 4),
               "ratio": round(on / off, 4), "same_tokens": tokens["off"] == tokens["on"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    ratios = [row["ratio"] for row in rows]
    summary = {"model": args.model, "dtype": args.dtype, "logprobs": args.logprobs, "prompts": len(rows),
               "median_ratio": round(statistics.median(ratios), 4), "min_ratio": min(ratios), "max_ratio": max(ratios),
               "all_same_tokens": all(row["same_tokens"] for row in rows)}
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w") as file:
            json.dump({"summary": summary, "rows": rows}, file, indent=1)


if __name__ == "__main__":
    main()
