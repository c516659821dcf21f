"""Compare Goose configurations without bfloat16 noise: float32 texts, time from a measured cost curve.

In bfloat16 every tree shape rounds a little differently, so two configurations soon decode
different texts and a per-prompt speed ratio compares different work (ratios of 0.5x-3x between
methods on one prompt are common). This script decodes in float32, where every lossless method
produces the same tokens, records each cycle's tree size, and estimates the wall time a device
would take as sum t(tree size) + the decoder's own measured per-cycle time, with t read from a
cost curve measured on that device (``goose calibrate --dtype bfloat16`` writes one to
``~/.cache/goose/calibration``). The budget planner plans with that same curve.

    python scripts/cost_model_ab.py --curve ~/.cache/goose/calibration/v2-...bfloat16...json \
        --limit 2 --variants '{"b32": {"budget": 32}}'

Prints per prompt the estimated tokens/s of every method, then the mean estimated speedup over a
one-token-per-pass loop, the ratio over ``pld`` per dataset, tau and the mean tree size, and
every method's tau per dataset. Each method keeps one decoder for all prompts, in order (what
``goose bench --warm-sources`` does), so a cross-request source learns from the earlier prompts.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np
import torch

from goose.bench.methods import ALL_METHODS
from goose.bench.prompts import load_samples
from goose.config import GooseConfig
from goose.cycle.decoder import GooseDecoder
from goose.models import encode_prompt, load
from goose.planning.cost import CostCurve

# Hugging Face prompt lookup's algorithm in Goose's terms: 2- then 1-gram, earliest occurrence, 10 tokens
HF_LIKE = {"sources": ["context_match"], "topology": "chain", "budget": 10,
           "source_options": {"context_match": {"ngram_sizes": [2, 1], "occurrence": "first", "max_continuation": 10}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--curve", type=Path, required=True, help="a cost-curve JSON from goose calibrate's cache")
    parser.add_argument("--limit", type=int, default=2, help="prompts per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--methods", default="pld,goose",
                        help="bench methods, study methods included (pld first: the reference)")
    parser.add_argument("--variants", default="{}", help='JSON {"name": {GooseConfig fields}} to add')
    parser.add_argument("--datasets", default="humaneval,mbpp,classeval,gsm8k,mt_bench")
    parser.add_argument("--prediction", default="",
                        help="comma-separated names of the methods and variants sent each sample's prediction "
                             "(default: the bench methods that send it, such as goose_pred)")
    args = parser.parse_args()

    torch.set_num_threads(2)
    model, tokenizer = load(args.model, dtype="float32", progress=False)
    curve = CostCurve.load(args.curve)  # the budget planner plans with the device curve too
    configs = {name: ALL_METHODS[name].config() for name in args.methods.split(",")}
    configs["hf_like"] = GooseConfig.model_validate(HF_LIKE)
    configs.update({name: GooseConfig.model_validate(fields) for name, fields in json.loads(args.variants).items()})
    decoders = {name: GooseDecoder(model, tokenizer, config, profile=True, cost_curve=curve)
                for name, config in configs.items()}
    predicting = set(filter(None, args.prediction.split(","))) | {
        name for name in configs if name in ALL_METHODS and ALL_METHODS[name].prediction}

    samples = [s for dataset in args.datasets.split(",") for s in load_samples(dataset, limit=args.limit)]
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for index, sample in enumerate(samples):
        prompt_ids = encode_prompt(tokenizer, sample.turns[0])  # the chat template where the model has one
        texts = []
        for name, decoder in decoders.items():
            options = {"prediction": sample.prediction} if name in predicting and sample.prediction else {}
            with torch.inference_mode():
                result = decoder.generate(prompt_ids, args.max_new_tokens, **options)
            decoder.verifier.reset()
            stats = result.stats
            own_time = sum(stats.profile.values()) - stats.profile.get("verify", 0.0)
            estimate = float(np.sum(curve(np.array(stats.tree_sizes)))) + own_time
            runs[name].append({"dataset": sample.dataset, "tokens": len(result.new_token_ids),
                               "steps": stats.verify_steps, "seconds": estimate,
                               "tree": float(np.mean(stats.tree_sizes))})
            texts.append(result.new_token_ids)
        same = "identical" if all(t == texts[0] for t in texts) else "DIFFERENT TEXTS"
        speeds = " ".join(f"{n}={r[-1]['tokens'] / r[-1]['seconds']:.1f}" for n, r in runs.items())
        print(f"{index:3d} {sample.dataset:10s} {same}  est. tok/s: {speeds}", flush=True)

    one_token = float(curve(1))
    print(f"\n{'method':12s} speedup  vs pld  tau   tree  vs pld per dataset")
    for name, rows in runs.items():
        speedup = statistics.mean(r["tokens"] * one_token / r["seconds"] for r in rows)
        ratios: dict[str, list[float]] = {}
        for row, reference in zip(rows, runs["pld"], strict=True):
            ratios.setdefault(row["dataset"], []).append(reference["seconds"] / row["seconds"])
        tau = sum(r["tokens"] for r in rows) / sum(r["steps"] for r in rows)
        per_dataset = " ".join(f"{d}={statistics.mean(v):.2f}" for d, v in ratios.items())
        overall = statistics.mean(v for values in ratios.values() for v in values)
        print(f"{name:12s} {speedup:6.2f}x {overall:6.3f} {tau:5.2f} {statistics.mean(r['tree'] for r in rows):5.1f}"
              f"  {per_dataset}")
    print(f"\n{'method':12s} tau per dataset")
    for name, rows in runs.items():
        taus = {}
        for dataset in dict.fromkeys(r["dataset"] for r in rows):
            picked = [r for r in rows if r["dataset"] == dataset]
            taus[dataset] = sum(r["tokens"] for r in picked) / sum(r["steps"] for r in picked)
        print(f"{name:12s} " + " ".join(f"{d}={t:.2f}" for d, t in taus.items()))


if __name__ == "__main__":
    main()
