"""Multi-level anisotropic tree: a main spine, shallow side spines and wide branches, split by expected yield.

Its settings are the ``spine`` topology's :class:`~goose.topologies.spine.SpineOptions`, given as
``topology_options["multi_spine"]`` (its rule 1 is the spine planner's tree).

The paper's spine tree serves two sources of very different quality; its "Limits" section calls for
a multi-level topology once a third source joins (retrieval, lookahead): the best source on the main
spine, the middle one(s) on shallow side spines, the weakest on wide branches. Sources are ranked by
their reported acceptance (the pool's order), so roles follow the estimates, not source names.

Rules, in order (B = budget):

1. Fewer than two drafting sources this cycle: the ``spine`` topology's tree, built by its planner
   (one drafter + one brancher: BuildSpineTree; a drafter alone: its chain; a brancher alone: the
   transition tree). A configured third source that has nothing to say this cycle changes nothing.
2. Consensus bypass (as in ``spine``): with ``options.consensus_bypass`` and the main draft's
   consensus >= ``options.bypass_threshold``, the main draft alone as a chain, up to B.
3. Roles. Main spine: the most trusted drafting source's most valuable root path. Side spines: every
   other drafting source's root path, in rank order; a side draft that shares its first c tokens
   with the main draft hangs off main-spine node c (the anchor when c = 0) and lays only what
   follows the divergence, at most ``config.max_depth`` tokens (side spines are shallow). A side
   draft that is a prefix of the main one adds nothing and is dropped. Branches: the most trusted
   branching source's successors.
4. Budget split by :func:`goose.planning.allocation.multi_spine_allocation`, recomputed every cycle from the
   current estimates (rounded to the planning grid, so the cached split serves most cycles): each spine's
   per-token acceptance is its source's estimate (the main draft's consensus run counts at its
   own, higher, scores), p_t is the brancher's. It returns how many tokens each spine lays and how
   many branch nodes hang at every spine node; a spine the model finds not worth its nodes gets
   none. The tier ratios of ``spine`` are not used: lengths come from the model. With
   ``options.branches = False`` every branch node goes to the anchor (the paper's "w/o spine
   branches" ablation).
5. Laying order is priority order: main spine (``on_spine``), then side spines in rank order (not
   ``on_spine``: a path that leaves the main spine for a side spine is a spine continuation), then
   branches grown best-first through the brancher's successors from every spine node, with the
   node's path score as the start score, successors below ``config.min_score`` left out, at most
   ``config.max_depth`` levels deep (``grow_branches``, as ``spine`` does). Nodes are deduplicated
   on (parent, token) and the first writer keeps the tag, so the walker credits the most trusted
   drafter. Shares that cannot be filled stay unspent: a smaller tree verifies faster.
"""

from __future__ import annotations

import numpy as np

import goose
from goose.config import GooseConfig
from goose.contract.candidates import CandidatePool, SourceCandidates, common_prefix
from goose.contract.tree import ROOT, DraftTree, TreeBuilder
from goose.hookspecs import Register
from goose.planning.allocation import MultiSpineAllocation, SpineSpec, multi_spine_allocation
from goose.topologies.spine import SpineOptions, SpineTopology
from goose.topologies.toolkit import EMPTY, grow_branches, priced


class SideSpine:
    """A side drafter's root path, split where it leaves the main draft."""

    def __init__(self, source: SourceCandidates, main_tokens: np.ndarray, max_length: int) -> None:
        self.source = source
        self.tokens, self.path_scores = source.draft.best_path
        self.attach = common_prefix(self.tokens, main_tokens)  # main-spine depth it hangs from
        self.available = min(self.tokens.shape[0] - self.attach, max_length)


class MultiSpineTopology:
    """Main spine for the best drafter, side spines for the others, branches for the brancher."""

    def __init__(self, config: GooseConfig) -> None:
        self.spine = SpineTopology(config, "multi_spine")
        self.options = self.spine.options
        self.last_allocation: MultiSpineAllocation | None = None  # for benchmarks and debugging

    @goose.hookimpl
    def goose_plan_tree(self, pool: CandidatePool, budget: int, config: GooseConfig) -> DraftTree:
        if len(pool.drafting) < 2 or budget <= 0:
            self.last_allocation = None
            return self.spine.goose_plan_tree(pool=pool, budget=budget, config=config)
        builder = pool.builder(budget)
        extension = budget - priced(budget, config)  # a fixed budget's extension: the main spine's alone
        budget -= extension
        main = pool.drafting[0]
        main_tokens, main_scores = main.draft.best_path
        consensus = min(main.draft.consensus, main_tokens.shape[0])
        if self.options.consensus_bypass and consensus >= self.options.bypass_threshold:
            self.last_allocation = None
            builder.add_chain(ROOT, main_tokens[: budget + extension], main.source_id, spine=True)
            return builder.build()

        sides = [SideSpine(source, main_tokens, config.max_depth) for source in pool.drafting[1:]]
        sides = [side for side in sides if side.available > 0]
        brancher = pool.branching[0] if pool.branching else None
        allocation = multi_spine_allocation(
            [SpineSpec(main_acceptance(main.acceptance, main_scores, consensus), main_tokens.shape[0])]
            + [SpineSpec((side.source.acceptance,), side.available, side.attach) for side in sides],
            p_t=brancher.acceptance if brancher is not None else 0.0,
            budget=budget,
            max_depth=config.max_depth,
        )
        self.last_allocation = allocation

        main_length = allocation.lengths[0] + extension
        spine = builder.add_chain(ROOT, main_tokens[:main_length], main.source_id, spine=True)
        starts, shares, start_scores = [np.concatenate([[ROOT], spine])], [allocation.widths[0]], [
            np.concatenate([[1.0], main_scores[: spine.shape[0]]])]
        for side, length, widths in zip(sides, allocation.lengths[1:], allocation.widths[1:], strict=True):
            if length == 0:
                continue
            nodes = lay_side_spine(builder, side, length)
            starts.append(nodes)
            shares.append(widths)
            start_scores.append(side.path_scores[side.attach : side.attach + nodes.shape[0]])
        if brancher is not None:
            self._add_branches(pool, builder, brancher, starts, shares, start_scores, config, self.options)
        return builder.build()

    @staticmethod
    def _add_branches(
        pool: CandidatePool,
        builder: TreeBuilder,
        brancher: SourceCandidates,
        starts: list[np.ndarray],
        shares: list[tuple[int, ...]],
        start_scores: list[np.ndarray],
        config: GooseConfig,
        options: SpineOptions,
    ) -> None:
        """Grow each spine node's share best-first (a spine cut short by the budget drops its shares)."""
        budgets = [np.asarray(share[: nodes.shape[0]], dtype=np.int64) for nodes, share in zip(starts, shares,
                                                                                               strict=True)]
        all_budgets = np.concatenate(budgets)
        if not options.branches:  # ablation: every branch node at the anchor
            all_budgets = np.concatenate([[all_budgets.sum()], np.zeros(all_budgets.shape[0] - 1, dtype=np.int64)])
        grow_branches(
            pool,
            builder,
            brancher,
            starts=np.concatenate([nodes[: b.shape[0]] for nodes, b in zip(starts, budgets, strict=True)]),
            budgets=all_budgets,
            start_scores=np.concatenate([s[: b.shape[0]] for s, b in zip(start_scores, budgets, strict=True)]),
            max_depth=config.max_depth,
            min_score=config.min_score,
            top_k=options.branch_top_k,
        )


def main_acceptance(acceptance: float, path_scores: np.ndarray, consensus: int) -> tuple[float, ...]:
    """Per-depth acceptance of the main spine: the source's estimate, raised over the consensus run.

    Tokens that several n-gram lengths agree on carry higher scores than the estimate (context
    match floors them at its ``consensus_score``); their geometric mean is the run's per-token rate.
    """
    if consensus <= 0:
        return (acceptance,)
    run = float(path_scores[consensus - 1]) ** (1.0 / consensus) if path_scores[consensus - 1] > 0 else 0.0
    return (max(acceptance, run),) * consensus + (acceptance,)


def lay_side_spine(builder: TreeBuilder, side: SideSpine, length: int) -> np.ndarray:
    """Lay a side draft's first ``attach + length`` tokens: the shared prefix is followed, the rest hangs off it.

    Returns the nodes of the side spine proper (depths attach + 1 ...), which may be fewer than
    ``length`` when the budget runs out.
    """
    nodes = builder.add_chain(ROOT, side.tokens[: side.attach + length], side.source.source_id)
    return nodes[side.attach :] if nodes.shape[0] > side.attach else EMPTY


@goose.hookimpl
def goose_register_topologies(register: Register) -> None:
    register(
        "multi_spine",
        MultiSpineTopology,
        description="multi-level anisotropic tree: main spine, side spines for further drafters, branches; "
        "budget split by expected yield",
        options=SpineOptions,
    )


__all__ = ["MultiSpineTopology", "SideSpine", "lay_side_spine", "main_acceptance"]
