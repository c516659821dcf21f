"""Where the cycles go on copy-heavy prompts: how fast a copy re-syncs, what a cycle buys after one fails.

Decodes copy-heavy prompts (the edit set, Spec-Bench's RAG and summarization) in float32, so every
configuration decodes the same text, with the budget planned from a bfloat16 cost curve and a fixed
per-cycle overhead (``--overhead-ms``), so the plans do not follow this machine's noise either.
Each cycle is recorded: the spine source's draft length, the tokens the pass gave, the tree's size.
A *copy cycle* is one where the spine source drafted; it *held* when the pass kept every drafted
token the tree could hold, and *departed* otherwise. Per configuration and dataset it prints:

- tau, the mean tree size and tokens/s estimated from the curve plus the fixed overhead;
- re-sync: after a departure, the cycles (and tokens) that pass before a copy drafts again, and the
  mean tree size of those draftless cycles;
- long copies: after 3 copies in a row held, how long the next draft is, how many of its tokens the
  pass keeps, and how often the tree (the budget) was what stopped it.

    python scripts/copy_cycles.py --curve ~/.cache/goose/calibration/v5-...smollm2...bfloat16...json \\
        --variants '{"ngram2": {"source_options": {"context_match": {"ngram_sizes": [5, 4, 3, 2]}}}}'
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from cost_model_ab import HF_LIKE  # the sibling scripts (this folder is on sys.path when a script runs)
from cycle_kinds import RecordingDecoder

from goose.bench.prompts import load_samples
from goose.config import GooseConfig
from goose.contract.candidates import CandidatePool
from goose.models import encode_prompt, load
from goose.planning.budget import BudgetPlanner, SpineLengths
from goose.planning.cost import CostCurve


class FixedOverheadPlanner(BudgetPlanner):
    """The automatic budget with a fixed per-cycle overhead and the curve as given, noting each spine draft."""

    def __init__(self, curve: CostCurve, overhead_s: float, max_depth: int) -> None:
        super().__init__(curve, max_depth=max_depth)
        self.overhead_s = overhead_s
        self.draft_lengths: list[int] = []

    def observe_overhead(self, seconds: float) -> None:
        pass  # fixed: the plan must not follow this machine's load

    def observe_verify(self, rows: int, seconds: float) -> None:
        pass  # float32 passes priced by the bfloat16 curve, as given

    def budget(self, pool: CandidatePool, spine_lengths: SpineLengths, extra_rows: int = 0) -> int:
        spine = pool.drafting[0] if pool.drafting else None
        self.draft_lengths.append(len(spine.draft) if spine is not None and spine.draft is not None else 0)
        return super().budget(pool, spine_lengths, extra_rows)


@dataclass
class Cycle:
    drafted: int  # the spine source's draft length (0: no draft)
    gained: int  # tokens the pass gave, the bonus included
    tree: int  # tree size, the anchor included

    @property
    def held(self) -> bool:
        return self.drafted > 0 and self.gained - 1 >= min(self.drafted, self.tree - 1)


def analyse(cycles: list[list[Cycle]], curve: CostCurve, overhead_s: float) -> dict[str, float]:
    """The figures of one configuration on a set of prompts (``cycles``: each prompt's cycles, in order)."""
    every = [c for prompt in cycles for c in prompt]
    tokens = sum(c.gained for c in every)
    seconds = float(np.sum(curve(np.array([c.tree for c in every])))) + overhead_s * len(every)
    lag_cycles, lag_tokens, lag_trees, long_drafts, long_kept, long_cut = [], [], [], [], [], []
    for prompt in cycles:
        for i, cycle in enumerate(prompt):
            if cycle.drafted and not cycle.held:  # a departure: count what passes before the next copy
                j = i + 1
                while j < len(prompt) and not prompt[j].drafted:
                    j += 1
                if j < len(prompt):
                    lag_cycles.append(j - i - 1)
                    lag_tokens.append(sum(c.gained for c in prompt[i + 1 : j]))
                    lag_trees += [c.tree for c in prompt[i + 1 : j]]
            if i >= 3 and cycle.drafted and all(c.held for c in prompt[i - 3 : i]):
                long_drafts.append(cycle.drafted)
                long_kept.append(cycle.gained - 1)
                long_cut.append(cycle.held and cycle.drafted > cycle.tree - 1)  # the tree, not the copy, stopped it
    mean = lambda values: statistics.mean(values) if values else float("nan")  # noqa: E731
    return {"cycles": len(every), "tau": tokens / len(every), "tree": mean([c.tree for c in every]),
            "tok_s": tokens / seconds, "copy_cycles": sum(bool(c.drafted) for c in every) / len(every),
            "departures": sum(bool(c.drafted) and not c.held for c in every),
            "resync_cycles": mean(lag_cycles), "resync_tokens": mean(lag_tokens), "resync_tree": mean(lag_trees),
            "long_draft": mean(long_drafts), "long_kept": mean(long_kept),
            "long_cut_by_tree": mean([float(x) for x in long_cut]), "long_cycles": len(long_drafts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--curve", type=Path, required=True, help="a bfloat16 cost-curve JSON from goose calibrate")
    parser.add_argument("--datasets", default="edit,rag,summarization")
    parser.add_argument("--limit", type=int, default=4, help="prompts per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--overhead-ms", type=float, default=2.5, help="the fixed per-cycle host time planned with")
    parser.add_argument("--variants", default="{}",
                        help='JSON {"name": {GooseConfig fields}} besides goose; a name that starts with goose_pred '
                        "decodes with each sample's prediction")
    parser.add_argument("--with-prediction", action="store_true",
                        help="also decode as goose_pred: goose with each sample's prediction (the edit set's code)")
    parser.add_argument("--only", default=None, help="comma-separated configurations to run (default: all)")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this file")
    args = parser.parse_args()

    torch.set_num_threads(2)
    model, tokenizer = load(args.model, dtype="float32", progress=False)
    curve = CostCurve.load(args.curve)
    overhead_s = args.overhead_ms / 1e3
    configs = {"goose": GooseConfig(), "hf_like": GooseConfig.model_validate(HF_LIKE),
               **{name: GooseConfig.model_validate(fields) for name, fields in json.loads(args.variants).items()}}
    if args.with_prediction:
        configs["goose_pred"] = GooseConfig()
    if args.only:
        unknown = set(args.only.split(",")) - set(configs)
        if unknown:
            parser.error(f"--only names unknown configurations: {', '.join(sorted(unknown))}")
        configs = {name: config for name, config in configs.items() if name in args.only.split(",")}
    samples = [s for dataset in args.datasets.split(",") for s in load_samples(dataset, limit=args.limit)]
    prompts = [encode_prompt(tokenizer, sample.turns[0]) for sample in samples]
    figures: dict[str, dict[str, dict[str, float]]] = {}
    texts: dict[str, list[list[int]]] = {}
    for name, config in configs.items():
        planner = FixedOverheadPlanner(curve, overhead_s, config.max_depth)
        decoder = RecordingDecoder(model, tokenizer, config, planner=planner)
        by_dataset: dict[str, list[list[Cycle]]] = {}
        texts[name] = []
        for sample, prompt in zip(samples, prompts, strict=True):
            planner.draft_lengths.clear()
            with torch.inference_mode():
                prediction = sample.prediction if name.startswith("goose_pred") else None
                result = decoder.generate(prompt, args.max_new_tokens, prediction=prediction)
            decoder.verifier.reset()
            stats = result.stats
            drafted = planner.draft_lengths if config.budget == "auto" else [0] * stats.verify_steps
            by_dataset.setdefault(sample.dataset, []).append(
                [Cycle(d, a, t) for d, a, t in zip(drafted, stats.accepted_lengths, stats.tree_sizes, strict=True)])
            texts[name].append(result.new_token_ids)
        figures[name] = {dataset: analyse(cycles, curve, overhead_s) for dataset, cycles in by_dataset.items()}
        figures[name]["all"] = analyse([p for cycles in by_dataset.values() for p in cycles], curve, overhead_s)
        print(f"{name} done", flush=True)
    same = all(text == next(iter(texts.values())) for text in texts.values())
    print(f"\nfloat32 texts identical across configurations: {same}")
    columns = ("tok_s", "tau", "tree", "copy_cycles", "departures", "resync_cycles", "resync_tokens", "resync_tree",
               "long_draft", "long_kept", "long_cut_by_tree")
    for dataset in [*dict.fromkeys(s.dataset for s in samples), "all"]:
        print(f"\n{dataset}\n{'config':10s} " + " ".join(f"{c:>14s}" for c in columns))
        for name in configs:
            row = figures[name][dataset]
            print(f"{name:10s} " + " ".join(f"{row[c]:14.2f}" for c in columns))
    if args.json:
        args.json.write_text(json.dumps({"arguments": vars(args) | {"curve": str(args.curve), "json": str(args.json)},
                                         "figures": figures}, indent=1))


if __name__ == "__main__":
    main()
