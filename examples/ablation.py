"""The paper's ablations (Table "Ablations") and baselines, each one a configuration change, never a code change.

    python examples/ablation.py [--max-new-tokens 64] [--budget 16] [--model smollm2-135m] [--prompt TEXT ...]

Every row builds a fresh GooseDecoder from ``GooseConfig`` fields (switching plugins on and off is
the ``sources`` list; the ablation switches are config fields or a source's options) and prints
tau, speed, the change against full Goose, and whether the output is token-for-token plain greedy
decoding (it must always be). On a CPU keep the budget small: width costs time there.
"""

from __future__ import annotations

import argparse
from typing import Any

from goose import GooseConfig, models
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder

ABLATIONS: dict[str, dict[str, Any]] = {
    "Goose (spine tree)": {},
    "w/o spine branches": {"spine_branches": False},
    "w/o bigram adjacency (unigram)": {"source_options": {"bigram_transition": {"unigram_only": True}}},
    "w/o consensus bypass": {"consensus_bypass": False},
    "w/o context-match spine": {"sources": ["bigram_transition"]},
    "w/o PLD tokens (shape kept)": {"spine_tokens": "transition"},
    "Iso(3), same sources": {"topology": "isotropic"},
    "PLD alone (chain)": {"sources": ["context_match"], "topology": "chain"},
    "TR alone (transition tree)": {"sources": ["bigram_transition"], "topology": "transition_tree"},
}
PROMPTS = [
    "Write a Python function that merges two sorted lists.",
    "A farmer has 12 cows and buys 3 times as many sheep. How many animals does he have? Let's think step by step.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--budget", type=int, default=16, help="draft-tree budget (the paper's GPU setting is 60)")
    parser.add_argument("--prompt", action="append", help="a prompt (repeatable); default: two built-in ones")
    args = parser.parse_args()

    model, tokenizer = models.load(args.model)
    prompts = args.prompt or PROMPTS
    reference = [AutoregressiveDecoder(model, tokenizer).generate(p, args.max_new_tokens) for p in prompts]
    base = GooseConfig(budget=args.budget).model_dump()
    print(f"{'configuration':<32} {'tau':>6} {'tok/s':>7} {'change':>8}  lossless")
    full_tau = None
    for name, fields in ABLATIONS.items():
        decoder = GooseDecoder(model, tokenizer, GooseConfig.model_validate({**base, **fields}))
        results = [decoder.generate(p, args.max_new_tokens) for p in prompts]  # one decoder: sources keep state
        tokens = sum(r.stats.new_tokens for r in results)
        tau = sum(sum(r.stats.accepted_lengths) for r in results) / sum(r.stats.verify_steps for r in results)
        speed = tokens / sum(r.stats.wall_s for r in results)
        full_tau = full_tau or tau
        lossless = all(r.new_token_ids == ref.new_token_ids for r, ref in zip(results, reference, strict=True))
        print(f"{name:<32} {tau:>6.2f} {speed:>7.1f} {100 * (tau / full_tau - 1):>+7.1f}%  {lossless}")


if __name__ == "__main__":
    main()
