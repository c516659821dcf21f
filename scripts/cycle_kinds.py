"""Where Goose's cycles go: cycles with a context-match draft against cycles without one.

Decodes benchmark prompts in float32 (the texts are the autoregressive ones, so runs compare the
same work) with the budget planned from a bfloat16 cost curve, and splits the cycles by whether
the spine source had a draft. ``--no-draft-budget N`` forces the budget of the cycles without a
draft (the pure transition trees), to see what the planner leaves on the table there.

    python scripts/cycle_kinds.py --curve ~/.cache/goose/calibration/v3-...smollm2...bfloat16...json \
        --limit 2 --no-draft-budget 24

Prints, per kind of cycle: count, tau, mean tree size, share of bonus-only cycles; then the time
the curve predicts for all verify passes and the tokens per second that gives.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import torch

from goose.bench.methods import METHODS
from goose.bench.prompts import load_samples
from goose.contract.candidates import CandidatePool
from goose.cycle.decoder import GooseDecoder
from goose.models import encode_prompt, load
from goose.planning.budget import BudgetPlanner, SpineLengths
from goose.planning.cost import CostCurve


class RecordingPlanner(BudgetPlanner):
    """The automatic budget, noting each cycle's spine draft and optionally forcing the budget of either kind."""

    def __init__(self, curve: CostCurve, no_draft_budget: int, draft_budget: int, max_depth: int) -> None:
        super().__init__(curve, max_depth=max_depth)
        self.no_draft_budget = no_draft_budget
        self.draft_budget = draft_budget
        self.draft_lengths: list[int] = []

    def budget(self, pool: CandidatePool, spine_lengths: SpineLengths, extra_rows: int = 0) -> int:
        spine = pool.drafting[0] if pool.drafting else None
        drafted = len(spine.draft) if spine is not None and spine.draft is not None else 0
        self.draft_lengths.append(drafted)
        forced = self.draft_budget if drafted else self.no_draft_budget
        return forced or super().budget(pool, spine_lengths, extra_rows)


class RecordingDecoder(GooseDecoder):
    """The Goose decoder planning its budgets with a :class:`RecordingPlanner`."""

    def __init__(self, *args, planner: RecordingPlanner, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.recording = planner

    @property
    def budget_planner(self) -> RecordingPlanner:
        return self.recording


def summary(label: str, cycles: list[tuple[int, int, int]]) -> None:
    if not cycles:
        return
    accepted = [a for _, a, _ in cycles]
    sizes = [s for _, _, s in cycles]
    print(f"{label:<10} cycles {len(cycles):5d}  tau {statistics.mean(accepted):.2f}  "
          f"tree {statistics.mean(sizes):5.1f}  bonus-only {sum(a == 1 for a in accepted) / len(cycles):4.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--curve", type=Path, required=True, help="a bfloat16 cost-curve JSON from goose calibrate")
    parser.add_argument("--limit", type=int, default=2, help="prompts per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--no-draft-budget", type=int, default=0, help="force this budget when nothing drafts")
    parser.add_argument("--draft-budget", type=int, default=0, help="force this budget when the spine source drafts")
    parser.add_argument("--datasets", default="humaneval,mbpp,classeval,gsm8k,mt_bench")
    args = parser.parse_args()

    torch.set_num_threads(2)
    model, tokenizer = load(args.model, dtype="float32", progress=False)
    curve = CostCurve.load(args.curve)  # the budget planner plans with the device curve too
    config = METHODS["goose"].config()
    planner = RecordingPlanner(curve, args.no_draft_budget, args.draft_budget, config.max_depth)
    decoder = RecordingDecoder(model, tokenizer, config, planner=planner)

    cycles: list[tuple[int, int, int]] = []  # (draft length, tokens gained, tree size)
    for dataset in args.datasets.split(","):
        for sample in load_samples(dataset, limit=args.limit):
            planner.draft_lengths.clear()
            with torch.inference_mode():
                result = decoder.generate(encode_prompt(tokenizer, sample.turns[0]), args.max_new_tokens)
            decoder.verifier.reset()
            stats = result.stats
            cycles += zip(planner.draft_lengths, stats.accepted_lengths, stats.tree_sizes, strict=True)

    summary("all", cycles)
    summary("no draft", [c for c in cycles if c[0] == 0])
    summary("draft", [c for c in cycles if c[0] > 0])
    seconds = float(np.sum(curve(np.array([size for _, _, size in cycles]))))
    tokens = sum(accepted for _, accepted, _ in cycles)
    print(f"verify time by the curve {seconds:.1f} s for {tokens} tokens: {tokens / seconds:.1f} tok/s")


if __name__ == "__main__":
    main()
