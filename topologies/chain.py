"""A single linear chain: Prompt Lookup Decoding's shape, the paper's "PLD" baseline.

The most trusted drafting source's best root path, as long as the draft and the budget allow
(no B*r cap: a chain spends nothing on width, so every budgeted node goes to depth). Without a
draft this cycle, the greedy top-1 successor chain of the most trusted branching source, up to
``config.max_depth`` tokens while each successor scores >= ``config.min_score``; without either,
the bare anchor (a plain autoregressive step).
"""

from __future__ import annotations

from goose.config import GooseConfig
from goose.contract.candidates import CandidatePool
from goose.contract.tree import ROOT, TreeBuilder
from goose.topologies.toolkit import Planner, grow_branches, priced, registration


class ChainTopology(Planner):
    """PLD's linear chain, falling back to a greedy successor chain."""

    extends_spine = True  # the chain is all spine: a fixed budget's extension lengthens it

    def lay(self, pool: CandidatePool, builder: TreeBuilder, budget: int, config: GooseConfig) -> None:
        if pool.drafting:
            source = pool.drafting[0]
            tokens, _ = source.draft.best_path
            builder.add_chain(ROOT, tokens[:budget], source.source_id, spine=True)
        elif pool.branching:
            # one successor per level (top_k=1) makes the best-first subtree a greedy chain
            grow_branches(
                pool,
                builder,
                pool.branching[0],
                starts=[ROOT],
                budgets=[min(priced(budget, config), config.max_depth)],
                start_scores=[1.0],
                max_depth=config.max_depth,
                min_score=config.min_score,
                top_k=1,
            )


goose_register_topologies = registration(
    "chain",
    ChainTopology,
    "PLD: the best draft as one linear chain (no tree)",
)
