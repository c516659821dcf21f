"""The topology author's toolkit: the shape helpers the built-in planners share.

A planner gets a :class:`goose.contract.candidates.CandidatePool` and lays a tree with its ``builder``; these
helpers do the recurring parts: harmonic branch widths along a spine, ranking within groups, and
best-first growth of branch subtrees through a source's successors. A drafting source's most
valuable root path is ``draft.best_path`` (tokens and path scores).

Every helper works a whole tree level at a time with NumPy ops; the only Python loops run over
depth levels (at most ``GooseConfig.max_depth``), never over nodes.

Scores are probabilities: a node's *path score* is the product of the conditional scores on its
root path, i.e. the estimated chance that the target accepts the whole path. The expected number
of accepted draft tokens of a tree is the sum of its nodes' path scores, which is why every
selection below ranks nodes by path score.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel

from goose.config import GooseConfig
from goose.contract.candidates import CandidatePool, SourceCandidates
from goose.contract.tree import DraftTree, TreeBuilder
from goose.hookspecs import Register, hookimpl

EMPTY = np.zeros(0, dtype=np.int64)


class Planner:
    """A planner with no state of its own that lays its tree into the pool's builder.

    The registry makes every topology with ``factory(config)``; a planner that keeps nothing
    between cycles subclasses this and implements :meth:`lay`, which is called only for a positive
    budget (otherwise the tree is the bare anchor), and ``goose_spine_lengths`` if it has a hint.
    A planner without a main spine gets the :func:`priced` budget; one with (``extends_spine``) gets
    the whole budget and keeps everything but its spine within the priced part.
    """

    extends_spine = False

    def __init__(self, config: GooseConfig) -> None:
        del config  # read per call from the hook's ``config`` argument

    @hookimpl
    def goose_plan_tree(self, pool: CandidatePool, budget: int, config: GooseConfig) -> DraftTree:
        if not self.extends_spine:
            budget = priced(budget, config)
        builder = pool.builder(budget)
        if budget > 0:
            self.lay(pool, builder, budget, config)
        return builder.build()

    def lay(self, pool: CandidatePool, builder: TreeBuilder, budget: int, config: GooseConfig) -> None:
        """Lay at most ``budget`` (> 0) draft nodes for ``pool`` with ``builder``."""
        raise NotImplementedError


def priced(budget: int, config: GooseConfig) -> int:
    """The part of ``budget`` for anything but the main spine: with a fixed ``config.budget`` the decoder
    adds ``config.spine_extension`` nodes the main spine alone may take (``goose_plan_tree``)."""
    return budget if config.budget == "auto" else min(budget, int(config.budget))


def registration(name: str, factory: Callable[[GooseConfig], object], description: str,
                 options: type[BaseModel] | None = None) -> Callable[[Register], None]:
    """The ``goose_register_topologies`` hook of a module that provides one planner (``options``: the model its
    ``topology_options`` are validated through)::

        goose_register_topologies = registration("chain", ChainTopology, "PLD: the best draft as one chain")
    """

    @hookimpl
    def goose_register_topologies(register: Register) -> None:
        register(name, factory, description=description, options=options)

    return goose_register_topologies


def harmonic_split(total: int, count: int) -> np.ndarray:
    """Split ``total`` nodes over ``count`` spine nodes, share i ∝ 1/(i+1) for spine depth i = 1..count.

    The reach probability of spine node i falls like p_s^i, so branches are worth most near the
    root (the paper's harmonic allocation). Floors first, then the leftover nodes go one each to
    the shallowest spine nodes: the shares sum to ``total`` exactly and never increase with depth.
    """
    if count <= 0:
        return EMPTY
    weights = 1.0 / np.arange(2, count + 2)
    shares = np.floor(total * weights / weights.sum()).astype(np.int64)
    shares[: total - int(shares.sum())] += 1
    return shares


def existing_children(builder: TreeBuilder, parents: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """bool, shaped like ``tokens`` [m, k]: the tree already has (parents[i], tokens[i, j])."""
    tree_parents, tree_tokens = builder.parents, builder.tokens
    same = (tree_parents == parents[:, None, None]) & (tree_tokens == tokens[:, :, None])
    return same.any(axis=2)


def rank_within_group(groups: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Rank of every item among the items of its group, best score first (ties: earlier item first)."""
    # one stable sort on a combined key: group first, then score descending (scores lie in [0, 1])
    order = np.argsort(groups + (1.0 - scores) * 0.5, kind="stable")
    sorted_groups = groups[order]
    sizes = np.bincount(sorted_groups)
    group_starts = np.cumsum(sizes) - sizes
    ranks = np.empty_like(order)
    ranks[order] = np.arange(order.shape[0]) - group_starts[sorted_groups]
    return ranks


def grow_branches(
    pool: CandidatePool,
    builder: TreeBuilder,
    source: SourceCandidates,
    starts: ArrayLike,
    budgets: ArrayLike,
    start_scores: ArrayLike,
    *,
    max_depth: int,
    min_score: float,
    top_k: int,
) -> np.ndarray:
    """Hang a best-first subtree of ``budgets[g]`` nodes under each existing tree node ``starts[g]``.

    Each subtree is the ``budgets[g]`` nodes with the highest path scores (start score times the
    successors' conditional scores) among the descendants reachable through ``source``'s top-k
    successors within ``max_depth`` levels, leaving out any successor whose own (conditional) score is
    below ``min_score``, as the paper's Algorithm 1 does. That set maximises the subtree's expected
    accepted tokens, and it is closed under ancestors because a child never outscores its parent.
    The floor is on the successor's own score, not its path score: a path score shrinks with every
    level, and a floor on it left most of a large budget unspent on deep, still likely paths.

    Two passes, level by level: *explore* keeps, per subtree and level, the best ``budgets[g]``
    candidates (a node outside them cannot be in the final set: that many nodes, plus their
    ancestors, beat it); *select* ranks all explored candidates of a subtree together and lays the
    winners, one ``add_children`` call per level. A successor that already exists under a start
    node (the next spine token, say) is not proposed again, so a branch never duplicates the
    spine. Returns the node indices laid.
    """
    starts, budgets = np.asarray(starts, dtype=np.int64), np.asarray(budgets, dtype=np.int64)
    start_scores = np.asarray(start_scores, dtype=np.float64)
    live = budgets > 0
    starts, budgets, start_scores = starts[live], budgets[live], start_scores[live]
    if starts.shape[0] == 0 or builder.room == 0:
        return EMPTY

    if source.successors is None:
        return EMPTY
    # explore: one successor query per level; a "row" is a node whose children are being proposed
    row_previous, row_tokens = builder.previous_tokens(starts, pool.previous), builder.tokens[starts]
    row_scores, row_groups = start_scores, np.arange(starts.shape[0])
    levels: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # rows, tokens, scores, groups
    for depth in range(max_depth):
        tokens, scores = source.successors(row_previous, row_tokens, top_k)
        path_scores = row_scores[:, None] * scores
        valid = (tokens >= 0) & (scores >= min_score)
        if depth == 0:  # children of existing nodes: skip the ones the tree already has
            valid &= ~existing_children(builder, starts, tokens)
        rows, columns = np.nonzero(valid)
        if rows.shape[0] == 0:
            break
        groups, path_scores, tokens = row_groups[rows], path_scores[rows, columns], tokens[rows, columns]
        if (np.bincount(groups, minlength=budgets.shape[0]) > budgets).any():  # some subtree must prune
            beam = rank_within_group(groups, path_scores) < budgets[groups]
            rows, tokens, path_scores, groups = rows[beam], tokens[beam], path_scores[beam], groups[beam]
        levels.append((rows, tokens, path_scores, groups))
        row_previous, row_tokens, row_scores, row_groups = row_tokens[rows], tokens, path_scores, groups

    # select: per subtree, the best budgets[g] explored candidates over all levels (parents come first
    # in this concatenation, so the stable ranking keeps a parent ahead of an equal-scoring child)
    if not levels:
        return EMPTY
    all_scores = np.concatenate([level[2] for level in levels])
    all_groups = np.concatenate([level[3] for level in levels])
    chosen = rank_within_group(all_groups, all_scores) < budgets[all_groups]

    # lay the winners level by level; row_nodes maps a level's rows to their tree nodes (-1: not laid)
    laid: list[np.ndarray] = []
    row_nodes, offset = starts, 0
    for rows, tokens, _, _ in levels:
        take = chosen[offset : offset + rows.shape[0]] & (row_nodes[rows] >= 0)
        nodes = np.full(rows.shape[0], -1, dtype=np.int64)
        offset += rows.shape[0]
        if not take.any():
            break
        nodes[take] = builder.add_children(row_nodes[rows[take]], tokens[take], source.source_id)
        laid.append(nodes[nodes >= 0])
        row_nodes = nodes
    return np.concatenate(laid) if laid else EMPTY
