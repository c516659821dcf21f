"""Three sources in one tree: context match on the main spine, REST on side spines, bigram transitions as branches.

    python examples/three_source_study.py [--max-new-tokens 96] [--budget 16] [--sources a,b,c]

Runs the two-source spine tree and the multi-level ``multi_spine`` tree on the same prompts and
prints tau, accepted-path kinds and per-source acceptance, next to the expected tau the acceptance
model (``goose.planning.allocation``) gives for the final estimates if every source drafted every cycle (real
sources draft only when they find a match, so measured tau sits below it). REST's default datastore is the Python
standard library, built once (about half a minute) and cached; ``--sources`` swaps in another
drafter, e.g. ``context_match,lookahead,bigram_transition``.
"""

from __future__ import annotations

import argparse

from goose import GooseConfig, models
from goose.cycle.decoder import GooseDecoder
from goose.planning import allocation

PROMPTS = [
    'Complete this Python function:\ndef read_json_lines(path):\n    """Yield one object per JSONL line."""\n',
    "Write a Python class for a bounded LRU cache with get and put methods.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--sources", default="context_match,rest,bigram_transition", help="main, side, brancher")
    args = parser.parse_args()
    sources = args.sources.split(",")

    model, tokenizer = models.load("smollm2-135m")
    runs = {"spine (2 sources)": GooseConfig(sources=[sources[0], sources[-1]], budget=args.budget),
            "multi_spine (3 sources)": GooseConfig(sources=sources, topology="multi_spine", budget=args.budget)}
    for name, config in runs.items():
        decoder = GooseDecoder(model, tokenizer, config)
        results = [decoder.generate(prompt, args.max_new_tokens) for prompt in PROMPTS]
        tau = sum(sum(r.stats.accepted_lengths) for r in results) / sum(r.stats.verify_steps for r in results)
        kinds = {k: sum(r.stats.path_kinds[k] for r in results) for k in results[0].stats.to_dict()["path_kinds"]}
        # the model's view of the final estimates: main spine (20-token draft), side spines (6), branches
        estimates = {s: decoder.sources.estimates[s].rate for s in config.sources}
        drafters, p_t = list(estimates.values())[:-1], estimates[config.sources[-1]]
        spines = [allocation.SpineSpec((p,), 20 if k == 0 else 6) for k, p in enumerate(drafters)]
        predicted = allocation.multi_spine_allocation(spines, p_t, args.budget).expected_tau
        print(f"{name}: tau {tau:.2f} (model, if every source drafted every cycle: {predicted:.2f}), paths {kinds}")
        print("   acceptance:", {s: round(p, 3) for s, p in estimates.items()})


if __name__ == "__main__":
    main()
