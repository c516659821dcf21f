"""Shape helpers the planners share: the spine's root path, harmonic widths, best-first branch growth.

Every helper works a whole tree level at a time with array ops; the only Python loops run over
depth levels (at most ``GooseConfig.max_depth``), never over nodes. The arrays are NumPy views
of the tensors sources and the TreeBuilder hand over: planning works on a few dozen numbers, where
a NumPy op costs about a microsecond and a torch op several, and some torch ops (``tril``,
``searchsorted``) wake the intra-op thread pool and stall for milliseconds on a busy CPU.

Scores are probabilities: a node's *path score* is the product of the conditional scores on its
root path, i.e. the estimated chance that the target accepts the whole path. The expected number
of accepted draft tokens of a tree is the sum of its nodes' path scores, which is why every
selection below ranks nodes by path score.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.typing import ArrayLike

from goose.candidates import CandidatePool, Draft, SourceCandidates
from goose.tree import TreeBuilder, ancestor_matrix

EMPTY = np.zeros(0, dtype=np.int64)


def as_tensor(values: np.ndarray) -> torch.Tensor:
    """A torch view of an int64 index array, for the TreeBuilder's API."""
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))


def as_array(values: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor (a copy only when it lives elsewhere or carries a gradient)."""
    if values.device.type == "cpu" and not values.requires_grad:
        return values.numpy()
    return values.detach().cpu().numpy()


def best_root_path(draft: Draft) -> tuple[np.ndarray, np.ndarray]:
    """Tokens [L] and path scores [L] of the draft's most valuable root path, in depth order.

    For a chain that is the whole chain. For a trie it is the root path whose nodes' path scores
    sum highest (the path with the most expected accepted tokens), so a long agreeing branch beats
    a short confident one only when it is worth more tokens.
    """
    tokens = draft.tokens.numpy()
    scores = np.clip(draft.scores.numpy().astype(np.float64), 0.0, 1.0)
    parents = draft.parents.numpy()
    if (parents == np.arange(-1, len(parents) - 1)).all():
        return tokens, np.cumprod(scores)
    shifted = torch.cat([torch.tensor([-1]), draft.parents + 1])  # the anchor becomes node 0
    ancestors = ancestor_matrix(shifted, len(draft))[1:, 1:].numpy().astype(np.float64)  # [m, m]
    path_scores = np.exp(ancestors @ np.log(np.maximum(scores, 1e-12)))
    path_value = ancestors @ path_scores  # expected accepted tokens along the path to each node
    members = np.flatnonzero(ancestors[int(path_value.argmax())])  # parents precede children
    return tokens[members], path_scores[members]


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


def ask_successors(
    source: SourceCandidates, previous: np.ndarray, tokens: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Ask ``source`` for successors of (previous, token) pairs, normalised to exactly [m, k].

    Missing entries are token -1 with score 0; scores are clamped to [0, 1] (NaN to 0) so that a
    child's path score never exceeds its parent's, which the best-first selections rely on.
    """
    m = tokens.shape[0]
    answer = source.successors(as_tensor(previous), as_tensor(tokens), k) if source.successors and m else None
    if answer is None or answer[0].ndim != 2 or answer[0].shape[0] != m or answer[1].shape != answer[0].shape:
        return np.full((m, k), -1, dtype=np.int64), np.zeros((m, k))
    answer_tokens = as_array(answer[0]).astype(np.int64, copy=False)[:, :k]
    answer_scores = as_array(answer[1])[:, :k]
    found_tokens, found_scores = answer_tokens, answer_scores
    if answer_tokens.shape[1] < k:  # a source may know fewer than k successors: pad with "none"
        found_tokens = np.full((m, k), -1, dtype=np.int64)
        found_scores = np.zeros((m, k))
        found_tokens[:, : answer_tokens.shape[1]] = answer_tokens
        found_scores[:, : answer_tokens.shape[1]] = answer_scores
    found_scores = np.where((found_tokens >= 0) & (found_scores > 0.0), np.minimum(found_scores, 1.0), 0.0)
    return found_tokens, found_scores


def previous_tokens(pool: CandidatePool, builder: TreeBuilder, nodes: np.ndarray) -> np.ndarray:
    """The token before each tree node on its root path (the anchor's is the context's previous token)."""
    parents = builder.parents.numpy()[nodes]
    return np.where(parents >= 0, builder.tokens.numpy()[np.maximum(parents, 0)], pool.previous)


def existing_children(builder: TreeBuilder, parents: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """bool, shaped like ``tokens`` [m, k]: the tree already has (parents[i], tokens[i, j])."""
    tree_parents, tree_tokens = builder.parents.numpy(), builder.tokens.numpy()
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
    successors within ``max_depth`` levels, dropping any below ``min_score``. That set maximises the
    subtree's expected accepted tokens, and it is closed under ancestors because a child never
    outscores its parent.

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

    # explore: one successor query per level; a "row" is a node whose children are being proposed
    row_previous, row_tokens = previous_tokens(pool, builder, starts), builder.tokens.numpy()[starts]
    row_scores, row_groups = start_scores, np.arange(starts.shape[0])
    levels: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # rows, tokens, scores, groups
    for depth in range(max_depth):
        tokens, scores = ask_successors(source, row_previous, row_tokens, top_k)
        path_scores = row_scores[:, None] * scores
        valid = (tokens >= 0) & (path_scores >= min_score)
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
        nodes[take] = builder.add_children(as_tensor(row_nodes[rows[take]]), as_tensor(tokens[take]),
                                           source.source_id).numpy()
        laid.append(nodes[nodes >= 0])
        row_nodes = nodes
    return np.concatenate(laid) if laid else EMPTY
