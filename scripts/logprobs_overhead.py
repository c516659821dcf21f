"""What asking for log probabilities costs a Goose generation: the same prompts with and without ``logprobs``.

Each prompt is generated once to warm up (its tokens are the reference), then ``--repeats`` times in
each mode, alternating (off, on, on, off, ...) so that drift on a shared machine and the decoder's
learning fall on both modes alike. Per prompt: the median wall time of each mode and their ratio, the
median time of the cycle phase that reads the log probabilities (the decoder's profile, "walk+commit")
in each mode, whose difference is their cost measured directly, and whether the tokens are the same
(they must be: log probabilities never change the output). The summary: medians over the prompts.

    python scripts/logprobs_overhead.py --threads 1 --datasets humaneval,gsm8k,mt_bench --limit 2 --repeats 3

(On a machine whose cores other work shares, use ``--threads 1``: with two threads every parallel region
of every operator waits for a core, and that wait, not Goose's work, sets the time.)
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from goose import models
from goose.cycle.decoder import GooseDecoder
from goose_bench.prompts import load_samples


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
    decoder = GooseDecoder(model, tokenizer, profile=True)
    prompts = [sample.turns[0] for name in args.datasets.split(",") for sample in load_samples(name, limit=args.limit)]
    rows = []
    for index, prompt in enumerate(prompts):
        options = {"off": {}, "on": {"logprobs": args.logprobs}}
        tokens = decoder.generate(prompt, args.max_new_tokens).new_token_ids  # warm-up, and the reference
        times: dict[str, list[float]] = {"off": [], "on": []}
        walk: dict[str, list[float]] = {"off": [], "on": []}
        same = True
        for repeat in range(args.repeats):
            order = ("off", "on") if repeat % 2 == 0 else ("on", "off")
            for mode in order:
                result = decoder.generate(prompt, args.max_new_tokens, **options[mode])
                times[mode].append(result.stats.wall_s)
                walk[mode].append(result.stats.profile["walk+commit"])
                same = same and result.new_token_ids == tokens
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        added = statistics.median(walk["on"]) - statistics.median(walk["off"])
        row = {"prompt": index, "new_tokens": len(tokens), "off_s": round(off, 4), "on_s": round(on, 4),
               "ratio": round(on / off, 4), "logprobs_s": round(added, 4), "logprobs_share": round(added / off, 4),
               "same_tokens": same}
        rows.append(row)
        print(json.dumps(row), flush=True)
    ratios = [row["ratio"] for row in rows]
    summary = {"model": args.model, "dtype": args.dtype, "logprobs": args.logprobs, "prompts": len(rows),
               "median_ratio": round(statistics.median(ratios), 4), "min_ratio": min(ratios), "max_ratio": max(ratios),
               "median_logprobs_share": round(statistics.median(row["logprobs_share"] for row in rows), 4),
               "all_same_tokens": all(row["same_tokens"] for row in rows)}
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w") as file:
            json.dump({"summary": summary, "rows": rows}, file, indent=1)


if __name__ == "__main__":
    main()
