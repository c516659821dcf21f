"""Iso(k): a balanced k-ary tree over the same candidate pool, the paper's topology baseline.

Every source is treated alike: at each node the k children are the best-scoring proposals of
all sources merged (a drafting source's trie children where the node lies on its draft, and
every branching source's successors). The tree grows breadth first, a level at a time, until
the budget is spent or ``config.max_depth`` levels are laid. Rules:

- one token proposed by several sources under the same parent is one candidate, scored with the
  best of their scores and tagged with the most trusted of them (the walker's source priority);
- candidates whose own score falls below ``config.min_score`` are dropped, as for the spine
  tree's branches, so the two topologies are compared under the same pruning rule;
- when a level does not fit in the budget, the candidates with the highest path scores get it.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from goose.config import GooseConfig
from goose.contract.candidates import CandidatePool
from goose.contract.tree import ROOT, TreeBuilder
from goose.topologies.toolkit import Planner, registration

NOT_IN_DRAFT = -2  # a tree node that is not on a drafting source's trie (-1 is the trie's root, the anchor)


class IsotropicOptions(BaseModel):
    """``topology_options["isotropic"]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    k: int = Field(default=3, ge=1, description="fan-out of the balanced k-ary tree (Iso(k))")


class IsotropicTopology(Planner):
    """A balanced tree with fan-out ``options.k``, all sources merged at every node."""

    def __init__(self, config: GooseConfig) -> None:
        self.k = IsotropicOptions.model_validate(config.options_for("isotropic")).k

    def lay(self, pool: CandidatePool, builder: TreeBuilder, budget: int, config: GooseConfig) -> None:
        # draft_nodes[s, v]: the node of drafting source s's trie that tree node v stands for
        draft_nodes = np.full((len(pool.drafting), budget + 1), NOT_IN_DRAFT, dtype=np.int64)
        draft_nodes[:, ROOT] = -1
        path_scores = np.zeros(budget + 1)
        path_scores[ROOT] = 1.0
        frontier = np.array([ROOT])
        for _ in range(config.max_depth):
            if frontier.shape[0] == 0 or builder.room == 0:
                break
            frontier = grow_level(pool, builder, frontier, draft_nodes, path_scores, self.k, config.min_score)


def proposals(
    pool: CandidatePool, builder: TreeBuilder, frontier: np.ndarray, draft_nodes: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, int, int]]]:
    """Every source's children for every frontier node, most trusted source first.

    Returns tokens [f, C] (-1: none), scores [f, C], the source id of every column [C], and for
    every drafting source its (drafting index, first column, width): a draft block spans its trie.
    """
    token_blocks, score_blocks, source_blocks = [], [], []
    draft_columns: list[tuple[int, int, int]] = []
    drafting_index = {candidate.source_id: s for s, candidate in enumerate(pool.drafting)}
    columns = 0
    for candidate in pool.candidates:
        if candidate.source_id in drafting_index:
            s = drafting_index[candidate.source_id]
            draft_parents = candidate.draft.parents
            is_child = draft_parents == draft_nodes[s, frontier, None]
            token_blocks.append(np.where(is_child, candidate.draft.tokens, -1))
            score_blocks.append(np.where(is_child, candidate.draft.scores, 0.0))
            source_blocks.append(np.full(draft_parents.shape[0], candidate.source_id))
            draft_columns.append((s, columns, draft_parents.shape[0]))
            columns += draft_parents.shape[0]
        if candidate.successors is not None:
            previous = builder.previous_tokens(frontier, pool.previous)
            tokens, scores = candidate.successors(previous, builder.tokens[frontier], k)
            token_blocks.append(tokens)
            score_blocks.append(scores)
            source_blocks.append(np.full(k, candidate.source_id))
            columns += k
    if not token_blocks:
        empty = np.zeros((frontier.shape[0], 0))
        return empty.astype(np.int64), empty, np.zeros(0, dtype=np.int64), []
    return (np.concatenate(token_blocks, axis=1), np.concatenate(score_blocks, axis=1),
            np.concatenate(source_blocks), draft_columns)


def grow_level(
    pool: CandidatePool,
    builder: TreeBuilder,
    frontier: np.ndarray,
    draft_nodes: np.ndarray,
    path_scores: np.ndarray,
    k: int,
    min_score: float,
) -> np.ndarray:
    """Lay up to k children under every frontier node; returns the new frontier."""
    tokens, scores, sources, draft_columns = proposals(pool, builder, frontier, draft_nodes, k)
    columns = tokens.shape[1]
    if columns == 0:
        return frontier[:0]

    # merge equal tokens under a node: best score; the first (most trusted) column keeps the tag
    valid = tokens >= 0
    same = (tokens[:, :, None] == tokens[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    merged = np.where(same, scores[:, None, :], -1.0).max(axis=2, initial=-1.0)
    first_column = same.argmax(axis=2)  # the column each proposal merges into
    is_first = valid & (first_column == np.arange(columns))
    child_scores = path_scores[frontier, None] * merged
    ranking = np.where(is_first & (merged >= min_score), child_scores, -1.0)
    best = np.argsort(-ranking, axis=1, kind="stable")[:, :k]  # top k columns per node
    best_scores = np.take_along_axis(ranking, best, axis=1)
    rows, ranks = np.nonzero(best_scores >= 0)
    picked, picked_scores = best[rows, ranks], best_scores[rows, ranks]
    if rows.shape[0] > builder.room:  # the last level: the budget goes to the best path scores
        keep = np.argsort(-picked_scores, kind="stable")[: builder.room]
        rows, picked, picked_scores = rows[keep], picked[keep], picked_scores[keep]

    node_of = np.full(tokens.shape, -1, dtype=np.int64)  # tree node laid for each (row, column)
    for source_id in np.unique(sources[picked]):
        mine = sources[picked] == source_id
        node_of[rows[mine], picked[mine]] = builder.add_children(
            frontier[rows[mine]], tokens[rows[mine], picked[mine]], int(source_id))
    laid = node_of[rows, picked]
    path_scores[laid[laid >= 0]] = picked_scores[laid >= 0]

    # a laid node continues every draft that proposed its token there, whoever's tag it carries
    for s, first, width in draft_columns:
        block = slice(first, first + width)
        nodes = np.take_along_axis(node_of, first_column[:, block], axis=1)
        on_draft = valid[:, block] & (nodes >= 0)
        draft_nodes[s, nodes[on_draft]] = np.nonzero(on_draft)[1]
    return laid[laid >= 0]


goose_register_topologies = registration(
    "isotropic",
    IsotropicTopology,
    "Iso(k): balanced k-ary tree, all sources' candidates merged at every node (baseline)",
    IsotropicOptions,
)
