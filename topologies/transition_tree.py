"""Token Recycling's static draft tree, filled from the most trusted branching source.

Token Recycling (Luo et al., arXiv 2408.08696) verifies a fixed tree shape whose slots are
addressed by sibling ranks: slot (0, 2) is "the 3rd best successor of the best first token".
Its published tree (80 nodes, depth 6, 8 root children) gives the top-ranked paths the most
descendants. Here the shape comes from a static prior instead of a hand-written list, so that
it scales to any budget: a slot's prior is the product over its path of
``DEPTH_DECAY / (rank + 1) ** RANK_EXPONENT``, and the template for budget B is the B slots with
the highest prior (ancestor-closed, since the prior only shrinks down a path). With TR's fan-out
of 8 and B = 80 the constants below keep 70 of the 80 slots of TR's tree, with the same level
sizes up to depth 3 (8, 21, 25); the planner's fan-out is its option ``fan_out``.

Filling is level by level: one successor query for all slots of a level's parents, then slot
(…, r) takes its parent's rank-r successor. Empty slots (no r-th successor, or one whose own score
is below ``config.min_score``) drop out with their subtrees; ``min_score = 0`` gives TR's plain
static fill. Drafting sources are ignored.
"""

from __future__ import annotations

import heapq
from functools import lru_cache

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from goose.config import GooseConfig
from goose.contract.candidates import CandidatePool, SourceCandidates
from goose.contract.tree import ROOT, TreeBuilder
from goose.topologies.toolkit import Planner, registration

DEPTH_DECAY = 0.6
RANK_EXPONENT = 1.3

# one template level: for every slot, the index of its parent slot in the level above, and its rank
TemplateLevel = tuple[np.ndarray, np.ndarray]


@lru_cache(maxsize=64)
def static_template(budget: int, fan_out: int, max_depth: int) -> tuple[TemplateLevel, ...]:
    """The ``budget`` slots with the highest static prior, as levels of (parent slot, rank).

    Built once per (budget, fan_out, max_depth) with a heap; planning only reads the cache.
    """
    frontier = [(-DEPTH_DECAY / (rank + 1) ** RANK_EXPONENT, (rank,)) for rank in range(fan_out)]
    heapq.heapify(frontier)
    chosen: list[tuple[int, ...]] = []
    while frontier and len(chosen) < budget:
        negative_prior, path = heapq.heappop(frontier)
        chosen.append(path)
        if len(path) < max_depth:
            for rank in range(fan_out):
                child_prior = negative_prior * DEPTH_DECAY / (rank + 1) ** RANK_EXPONENT
                heapq.heappush(frontier, (child_prior, (*path, rank)))
    levels: list[TemplateLevel] = []
    slot_of: dict[tuple[int, ...], int] = {(): 0}
    for depth in range(1, max_depth + 1):
        paths = sorted(path for path in chosen if len(path) == depth)
        if not paths:
            break
        parents = np.array([slot_of[path[:-1]] for path in paths], dtype=np.int64)
        ranks = np.array([path[-1] for path in paths], dtype=np.int64)
        slot_of.update({path: slot for slot, path in enumerate(paths)})
        levels.append((parents, ranks))
    return tuple(levels)


class TransitionTreeOptions(BaseModel):
    """``topology_options["transition_tree"]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    fan_out: int = Field(default=10, ge=1, description="successor ranks a template slot may take (TR's is 8)")


def lay_transition_tree(pool: CandidatePool, builder: TreeBuilder, source: SourceCandidates, budget: int,
                        fan_out: int, config: GooseConfig) -> None:
    """Fill the static template for ``budget`` nodes under the anchor with ``source``'s successors."""
    slot_nodes = np.array([ROOT])  # tree node of every slot of the level above (-1: empty)
    slot_scores = np.ones(1)
    for parents, ranks in static_template(budget, fan_out, config.max_depth):
        live = np.flatnonzero(slot_nodes >= 0)
        row_of_slot = np.full(slot_nodes.shape[0], -1)
        row_of_slot[live] = np.arange(live.shape[0])
        nodes = slot_nodes[live]
        successors, scores = source.successors(
            builder.previous_tokens(nodes, pool.previous), builder.tokens[nodes], int(ranks.max()) + 1)
        rows = row_of_slot[parents]  # -1 under an empty slot: the whole subtree stays empty
        tokens = np.where(rows >= 0, successors[rows, ranks], -1)
        own_scores = np.where(rows >= 0, scores[rows, ranks], 0.0)
        path_scores = slot_scores[parents] * own_scores
        filled = (tokens >= 0) & (own_scores >= config.min_score)
        if not filled.any():
            break
        slot_nodes = np.full(tokens.shape[0], -1, dtype=np.int64)
        slot_nodes[filled] = builder.add_children(nodes[rows[filled]], tokens[filled], source.source_id)
        slot_scores = path_scores


class TransitionTreeTopology(Planner):
    """TR's static tree shape, filled by the most trusted branching source; the bare anchor without one."""

    def __init__(self, config: GooseConfig) -> None:
        self.fan_out = TransitionTreeOptions.model_validate(config.options_for("transition_tree")).fan_out

    def lay(self, pool: CandidatePool, builder: TreeBuilder, budget: int, config: GooseConfig) -> None:
        if pool.branching:
            lay_transition_tree(pool, builder, pool.branching[0], budget, self.fan_out, config)


goose_register_topologies = registration(
    "transition_tree",
    TransitionTreeTopology,
    "Token Recycling: a static tree (top ranks deepest) filled with transition successors",
    TransitionTreeOptions,
)
