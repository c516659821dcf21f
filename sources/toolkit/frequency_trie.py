"""Merging many continuations into one trie with counts: what REST and the suffix memory draft.

A node's count is how many continuations pass through it, so count(node) / count(parent) is the
empirical chance of its token after its path: the score planners expect.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FrequencyTrie:
    """A trie of continuations: nodes in depth order (parents first), -1 = child of the anchor."""

    tokens: np.ndarray  # int64 [m]
    parents: np.ndarray  # int64 [m]
    counts: np.ndarray  # int64 [m]: continuations through the node
    scores: np.ndarray  # float32 [m]: counts / parent's count (the root's count is ``total``)
    total: int  # continuations with at least one token
    depths: np.ndarray  # int64 [m]: 1 for the anchor's children

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def frequency_trie(continuations: np.ndarray, max_nodes: int) -> FrequencyTrie:
    """Merge continuations (int64 [k, L]; a row ends at its first negative entry) into a trie; keep the top nodes.

    Rows sorted lexicographically put every shared prefix in one run of rows, so a row opens a
    node at depth d where its first d + 1 tokens differ from the row before it; the node's count
    is the number of live rows in its run. Nodes are numbered depth by depth (parents first), in
    row order within a depth. Then the ``max_nodes`` nodes with the highest counts are kept. A
    child never counts more than its parent and ties go to the shallower node, so the kept set
    holds every kept node's ancestors. A handful of 2-D array operations, whatever the depth
    (this runs every cycle of the suffix memory, and of REST).
    """
    rows, length = continuations.shape
    alive = np.cumprod(continuations >= 0, axis=1).astype(bool)  # a row is dead after its first -1
    total = int(alive[:, 0].sum()) if length else 0
    if total == 0 or max_nodes <= 0:
        empty = np.zeros(0, dtype=np.int64)
        return FrequencyTrie(empty, empty, empty, np.zeros(0, dtype=np.float32), total, empty)
    if total == 1:  # one continuation (a long match's usual case): the trie is its chain, every score 1
        row = int(np.argmax(alive[:, 0]))
        chain = continuations[row][alive[row]][:max_nodes].astype(np.int64)
        ones = np.ones(chain.shape[0], dtype=np.int64)
        depths = np.arange(1, chain.shape[0] + 1, dtype=np.int64)
        return FrequencyTrie(chain, depths - 2, ones, ones.astype(np.float32), 1, depths)
    cleaned = np.where(alive, continuations, -1)
    order = np.lexsort(cleaned.T[::-1])  # lexicographic; a dead entry (-1) sorts before every token
    ordered, live = cleaned[order], alive[order]
    differ = ordered[1:] != ordered[:-1]
    first_difference = np.where(differ.any(axis=1), differ.argmax(axis=1), length)
    opens = live & np.concatenate([np.ones((1, length), dtype=bool),
                                   first_difference[:, None] <= np.arange(length)])
    depth_of, row_of = np.nonzero(opens.T)  # depth-major: parents get lower ids than children
    count = depth_of.shape[0]
    ids = np.full((rows, length), -1, dtype=np.int64)
    ids[row_of, depth_of] = np.arange(count)
    # each live cell belongs to the node opened at or above it in its column
    opener = np.maximum.accumulate(np.where(opens, np.arange(rows)[:, None], -1), axis=0)
    node_of = np.where(live, ids[np.maximum(opener, 0), np.arange(length)], -1)
    counts = np.bincount(node_of[live], minlength=count)
    tokens = ordered[row_of, depth_of]
    parents = np.where(depth_of > 0, node_of[row_of, np.maximum(depth_of - 1, 0)], -1)
    # ids grow with depth, so sorting the kept ids puts parents before children
    kept = np.sort(np.lexsort((depth_of, -counts))[:max_nodes])
    position = np.full(count, -1, dtype=np.int64)
    position[kept] = np.arange(kept.shape[0])
    old_parents = parents[kept]
    parent_counts = np.where(old_parents >= 0, counts[np.maximum(old_parents, 0)], total)
    return FrequencyTrie(
        tokens=tokens[kept].astype(np.int64),
        parents=np.where(old_parents >= 0, position[np.maximum(old_parents, 0)], -1).astype(np.int64),
        counts=counts[kept].astype(np.int64),
        scores=(counts[kept] / parent_counts).astype(np.float32),
        total=total,
        depths=depth_of[kept].astype(np.int64) + 1,
    )
