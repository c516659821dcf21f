"""The acceptance model and the exact expected yield of any tree under it (arXiv 2604.02047).

Every draft token is correct with a fixed probability given that its parent was accepted,
independently of everything else. The walker goes down from the anchor and at every node follows
the *first* correct child in priority order (the tree's index order). A node then lies on the
accepted path with probability

    value(v) = value(parent) * q_v * prod_{earlier siblings s of v} (1 - q_s)        (value(anchor) = 1)

and, since the accepted nodes form one path, E[tau] = 1 + sum_v value(v) exactly. The best-first
transition tree (:func:`branch_unit`) is the branch shape the optimisers lay under this model.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class TreeShape:
    """A draft tree for the acceptance model: parent array and per-node conditional acceptance.

    parents int64 [n]: -1 for a child of the anchor, otherwise an earlier node; siblings are
    tried in index order. acceptance float [n]: P(node correct | parent accepted).
    """

    parents: np.ndarray
    acceptance: np.ndarray

    def __post_init__(self) -> None:
        parents = np.asarray(self.parents, dtype=np.int64)
        acceptance = np.asarray(self.acceptance, dtype=np.float64)
        n = parents.shape[0]
        if parents.ndim != 1 or acceptance.shape != (n,):
            raise ValueError("parents and acceptance must be 1-D arrays of the same length")
        if n and not ((parents >= -1) & (parents < np.arange(n))).all():
            raise ValueError("parents must satisfy -1 <= parents[i] < i")
        if n and not ((acceptance >= 0.0) & (acceptance <= 1.0)).all():
            raise ValueError("acceptance values must lie in [0, 1]")
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "acceptance", acceptance)

    def __len__(self) -> int:
        return int(self.parents.shape[0])


def node_values(shape: TreeShape) -> np.ndarray:
    """P(node on the accepted path) for every node: value(parent) * q * prod over earlier siblings (1 - q)."""
    n = len(shape)
    values = np.empty(n)
    missed = np.ones(n + 1)  # per parent (+1): prod of (1 - q) over its children seen so far
    parents, acceptance = shape.parents.tolist(), shape.acceptance.tolist()
    for node in range(n):  # a few dozen nodes: a plain loop beats array ops here
        parent = parents[node]
        reach = 1.0 if parent < 0 else values[parent]
        values[node] = reach * missed[parent + 1] * acceptance[node]
        missed[parent + 1] *= 1.0 - acceptance[node]
    return values


def expected_tau_tree(
    parents: Sequence[int] | np.ndarray | TreeShape, acceptance: Sequence[float] | np.ndarray | None = None
) -> float:
    """Exact E[tau] of any tree under the first-match acceptance model: 1 + sum of node values."""
    shape = parents if isinstance(parents, TreeShape) else TreeShape(np.asarray(parents), np.asarray(acceptance))
    return 1.0 + float(node_values(shape).sum())


@lru_cache(maxsize=512)
def branch_unit(p_t: float, size: int, max_depth: int) -> tuple[np.ndarray, np.ndarray]:
    """The best-first transition tree of up to ``size`` nodes: (parents, values), values non-increasing.

    Node values are p_t (1 - p_t)^rank times the parent's value (first match among siblings), so a
    node's next sibling and first child never beat it and a heap pops them in value order; any
    prefix of the result is the best tree of that size (ancestor-closed), and the result for a
    smaller ``size`` is a prefix of this one. Values of zero are left out. Read-only arrays, cached.
    """
    parents: list[int] = []
    values: list[float] = []
    miss = 1.0 - p_t
    heap: list[tuple[float, int, int, int]] = [(-p_t, 0, -1, 1)]  # (-value, tie, parent, depth)
    tie = 1
    while heap and len(values) < size:
        negative, _, parent, depth = heapq.heappop(heap)
        if -negative <= 0.0:
            break
        node = len(values)
        parents.append(parent)
        values.append(-negative)
        heapq.heappush(heap, (negative * miss, tie, parent, depth))  # next sibling
        if depth < max_depth:
            heapq.heappush(heap, (negative * p_t, tie + 1, node, depth + 1))  # first child
        tie += 2
    result = np.array(parents, dtype=np.int64), np.array(values, dtype=np.float64)
    for array in result:
        array.flags.writeable = False
    return result


def branch_heads(unit_parents: np.ndarray, shares: Sequence[int]) -> tuple[int, ...]:
    """First-level nodes among the first ``share`` nodes of a best-first branch, for every share."""
    heads = np.concatenate([[0], np.cumsum(unit_parents < 0)])
    return tuple(heads[np.minimum(shares, unit_parents.shape[0])].tolist())


def branch_values(scales: np.ndarray, unit: np.ndarray, count: int) -> np.ndarray:
    """[rows, columns]: the value of the k-th node of a best-first branch at each row (only the first count matter)."""
    return scales[:, None] * unit[None, : max(0, count)]
