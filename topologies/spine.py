"""Goose's BuildSpineTree: a deep spine from the most trusted drafting source, branches from a branching one.

The sources differ several-fold in acceptance (context match p_s 0.07–0.60 per token, transition
p_t 0.03–0.05), so a balanced tree wastes budget. The trusted draft goes on a linear spine; the
weak but always-available successors hang off it as branches, wide near the root where they are
reached most often. When the spine breaks at node i, a branch at node i can still carry the path
on ("spine continuation").

Its settings are :class:`SpineOptions` (``GooseConfig.topology_options["spine"]``; ``multi_spine`` reads the same
model under its own name). Rules, in order (B = budget, r = ``options.ratio(spine source acceptance)``,
c = consensus):

1. No drafting source this cycle: the whole budget is a best-first tree of the branching source's
   successors (``grow_branches`` from the anchor: the paper's spine tree with an empty spine). Token
   Recycling's static template (``transition_tree``) fixes slots by sibling rank, and where the target
   is sure of its next token most of a large budget's slots find no successor above the floor.
   No branching source: the spine alone, as long as the draft and B allow. Only the most trusted
   drafting and the most trusted branching source take part; side spines for a third source are
   a different topology.
2. Consensus bypass: with ``options.consensus_bypass`` and c >= ``options.bypass_threshold``, the
   spine alone, as long as the draft and B allow. Several n-gram lengths agreeing on 8+ tokens is
   the strongest evidence there is (the paper loses 5.1% tau without the bypass), and capping such
   a match at B*r is what lost the measured Gemma MBPP runs to a plain 10-token chain.
3. Spine length L = min(draft path length, B, max(1, round(B*r), c)), rounding half up: the tier
   ratio, stretched to cover every token the n-gram lengths agree on (the paper's "extend more
   aggressively"). With ``options.split = "optimal"`` the tier share round(B*r) is replaced by
   the spine length of the best spine tree of B nodes under the sources' acceptance estimates
   (:func:`goose.planning.allocation.best_spine_tree`, per-depth spine estimates included): the tiers are
   the paper's fixed-budget rule, and with a budget chosen per cycle they would make a trusted
   40-token copy pay for 40 branch nodes to be laid whole. The spine is not pruned by
   ``min_score``: its scores are the spine source's own confidence, and the tier ratio (or the
   optimum) already sets how far to trust it. A trie draft contributes its
   most valuable root path (``draft.best_path``); its other nodes are left out, since the branch
   budget is better spent on successors of the spine.
4. The R = B - L nodes left: round(rho * R) to root branches (children of the anchor, the pure
   transition paths), the rest split over spine nodes 1..L harmonically (share ∝ 1/(depth+1)).
   The last spine node's share continues the path past the end of the spine. With
   ``options.branches = False`` all of R goes to the root.
5. Each share is grown best-first through the branching source's successors up to
   ``config.max_depth`` levels below its spine node, ranked by path score (spine path score times
   successor scores), leaving out successors whose own score is below ``config.min_score``
   (``grow_branches``). Shares that cannot be filled (unknown successors) stay unspent.
6. With a fixed budget B (the paper's setting) the decoder hands B + ``config.spine_extension``: the
   spine goes on that many more draft tokens past its share, and the branches keep B's: the budget
   prices the branches, and a long copy the target keeps accepting is verified in one pass instead of
   one budget's share a pass (the paper's code grows a confident chain to 100 nodes at B = 60). The
   automatic budget prices the whole tree, spine included, with the device's cost curve, and hands
   no extension.
7. With a fixed budget, room the branches leave unspent (successors below ``config.min_score``, or
   none known) goes to the spine: it runs on past its share and extension while the draft lasts, so
   the tree holds the nodes its budget allows. A long copy whose branches find little to hang is
   verified deeper in one pass (the paper's code lays 91 spine nodes of a 96-node tree on a
   confident match). The automatic budget has already chosen the spine whose expected yield pays for
   its rows; more copied tokens past it are rows the cost curve did not buy.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

import goose
from goose.config import GooseConfig
from goose.contract.candidates import CandidatePool, SourceCandidates
from goose.contract.tree import ROOT, TreeBuilder
from goose.planning.allocation import best_spine_tree
from goose.topologies.toolkit import Planner, grow_branches, harmonic_split, priced, registration


class SpineTier(BaseModel):
    """Spine ratio r used while the spine source's acceptance EMA is below ``below``."""

    model_config = ConfigDict(frozen=True)
    below: float = Field(gt=0.0)
    ratio: float = Field(gt=0.0, le=1.0)


def _paper_tiers() -> list[SpineTier]:
    # p_s < 0.2 -> r = 0.15; < 0.4 -> 0.30; >= 0.4 -> 0.50
    return [SpineTier(below=0.2, ratio=0.15), SpineTier(below=0.4, ratio=0.30), SpineTier(below=1.01, ratio=0.50)]


class SpineOptions(BaseModel):
    """The spine topology's settings, the paper's defaults; the ``no_*`` ablations of its Table "Ablations" are
    ``branches``, ``consensus_bypass`` and ``tokens``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    split: Literal["tiers", "optimal"] = Field(
        default="optimal",
        description="how a budget splits between spine and branches: 'optimal', the spine length of the best "
        "spine tree under the acceptance estimates (goose.planning.allocation.best_spine_tree), so a trusted long "
        "copy is laid whole instead of sharing the budget with weak branches; 'tiers', the paper's ratio r of B by "
        "the spine source's acceptance (docs/results.md has both measured)")
    tiers: list[SpineTier] = Field(default_factory=_paper_tiers, description="r by acceptance, for split='tiers'")
    branch_ratio: float = Field(default=0.5, ge=0.0, le=1.0, description="rho: share of the off-spine budget "
                                "spent at the root")
    branch_top_k: int = Field(default=10, ge=1, description="widest fan-out the branching source may give a node")
    bypass_threshold: int = Field(default=8, ge=1, description="consensus length that skips the tree (rule 2)")
    consensus_bypass: bool = Field(default=True, description="False: never take the linear bypass")
    branches: bool = Field(default=True, description="False: no branches on spine nodes (root only)")
    tokens: Literal["draft", "transition"] = Field(
        default="draft", description="'transition': keep the spine's length but fill it with the branching "
        "source's greedy successor chain (the paper's 'w/o PLD tokens, shape kept' ablation)")

    @model_validator(mode="after")
    def _tiers_sorted(self) -> SpineOptions:
        bounds = [tier.below for tier in self.tiers]
        if bounds != sorted(bounds) or not bounds:
            raise ValueError("tiers must be non-empty and sorted by 'below'")
        return self

    def ratio(self, spine_acceptance: float) -> float:
        """Confidence-adaptive spine ratio r for the spine source's current acceptance EMA."""
        return next((tier.ratio for tier in self.tiers if spine_acceptance < tier.below), self.tiers[-1].ratio)


def spine_length(budget: int, ratio: float, consensus: int, available: int) -> int:
    """Rule 3: the tier's share of the budget, stretched to the consensus, within draft and budget."""
    tier_length = max(1, int(budget * ratio + 0.5))
    return min(available, budget, max(tier_length, consensus))


class SpineTopology(Planner):
    """The anisotropic spine tree of the Goose paper (BuildSpineTree), with consensus bypass."""

    extends_spine = True

    def __init__(self, config: GooseConfig, name: str = "spine") -> None:
        self.options = SpineOptions.model_validate(config.options_for(name))

    def lay(self, pool: CandidatePool, builder: TreeBuilder, budget: int, config: GooseConfig) -> None:
        extension = budget - priced(budget, config)  # rule 6: the main spine's alone
        budget -= extension
        if not pool.drafting:
            if pool.branching:  # rule 1: the whole budget to the branching source, best first
                grow_branches(pool, builder, pool.branching[0], starts=[ROOT], budgets=[budget], start_scores=[1.0],
                              max_depth=config.max_depth, min_score=config.min_score, top_k=self.options.branch_top_k)
            return

        spine_source = pool.drafting[0]
        tokens, path_scores = spine_source.draft.best_path
        length, alone = self._spine_rule(pool, budget, tokens.shape[0], config)
        if alone:
            builder.add_chain(ROOT, tokens[: length + extension], spine_source.source_id, spine=True)
            return
        branch_room = budget - length
        length = min(tokens.shape[0], length + extension)  # rule 6: deeper on the spine, outside the budget

        if self.options.tokens == "transition":  # ablation: the same spine shape, transition tokens on it
            spine = self._transition_spine(pool, builder, pool.branching[0], length, config)
            path_scores = np.ones(spine.shape[0])
        else:
            spine = builder.add_chain(ROOT, tokens[:length], spine_source.source_id, spine=True)
        self._add_branches(pool, builder, pool.branching[0], spine, path_scores[: spine.shape[0]], branch_room,
                           config)
        fixed = config.budget != "auto"
        if fixed and builder.room and self.options.tokens == "draft" and spine.shape[0] == length:  # rule 7
            builder.add_chain(int(spine[-1]), tokens[length : length + builder.room], spine_source.source_id,
                              spine=True)

    @goose.hookimpl
    def goose_spine_lengths(
        self, pool: CandidatePool, budgets: tuple[int, ...], config: GooseConfig
    ) -> tuple[int, ...]:
        """The spine ``goose_plan_tree`` lays for every budget (the same rule), for the budget planner."""
        if not pool.drafting:
            return tuple(0 for _ in budgets)
        available = pool.drafting[0].draft.best_path[0].shape[0]
        return tuple(self._spine_rule(pool, budget, available, config)[0] for budget in budgets)

    def _spine_rule(self, pool: CandidatePool, budget: int, available: int, config: GooseConfig) -> tuple[int, bool]:
        """Rules 2 and 3: (spine length, whether the spine goes alone) for a draft of ``available`` tokens.

        Alone, as long as draft and budget allow, on a consensus bypass or with no branching
        source; otherwise the tier's share of the budget stretched to the consensus.
        """
        spine_source = pool.drafting[0]
        consensus = spine_source.draft.consensus
        options = self.options
        if not pool.branching or (options.consensus_bypass and consensus >= options.bypass_threshold):
            return min(available, budget), True
        if options.split == "optimal":
            best = best_spine_tree(spine_source.spine_acceptance, pool.branching[0].acceptance, budget,
                                   config.max_depth, max_spine=available)
            return min(available, budget, max(1, best.spine_len, consensus)), False
        return spine_length(budget, options.ratio(spine_source.acceptance), consensus, available), False

    @staticmethod
    def _transition_spine(
        pool: CandidatePool, builder: TreeBuilder, source: SourceCandidates, length: int, config: GooseConfig
    ) -> np.ndarray:
        """The branching source's greedy top-1 successor chain of ``length`` tokens, laid as the spine."""
        tokens: list[int] = []
        previous, token = pool.previous, pool.anchor
        for _ in range(length):  # one successor query per spine level (length <= budget, a few dozen)
            successors, _ = source.successors(np.array([previous]), np.array([token]), 1)
            if int(successors[0, 0]) < 0:
                break
            previous, token = token, int(successors[0, 0])
            tokens.append(token)
        return builder.add_chain(ROOT, np.asarray(tokens, dtype=np.int64), source.source_id, spine=True)

    def _add_branches(
        self,
        pool: CandidatePool,
        builder: TreeBuilder,
        branch_source: SourceCandidates,
        spine: np.ndarray,
        spine_scores: np.ndarray,
        remaining: int,
        config: GooseConfig,
    ) -> None:
        """Rules 4 and 5: root share rho, harmonic shares along the spine, grown best-first (``remaining`` nodes)."""
        if self.options.branches:
            root_share = int(self.options.branch_ratio * remaining + 0.5)
            spine_shares = harmonic_split(remaining - root_share, spine.shape[0])
        else:
            root_share, spine_shares = remaining, np.zeros(spine.shape[0], dtype=np.int64)
        grow_branches(
            pool,
            builder,
            branch_source,
            starts=np.concatenate([[ROOT], spine]),
            budgets=np.concatenate([[root_share], spine_shares]),
            start_scores=np.concatenate([[1.0], spine_scores]),
            max_depth=config.max_depth,
            min_score=config.min_score,
            top_k=self.options.branch_top_k,
        )


goose_register_topologies = registration(
    "spine",
    SpineTopology,
    "Goose BuildSpineTree: context-match spine, harmonic transition branches, consensus bypass",
    SpineOptions,
)
