"""Several drafting sources: a main spine, side spines where other drafts diverge, branches everywhere.

A main spine, side spines hanging off main-spine nodes (where their drafts diverge), branches at
every spine node, each spine with its own per-depth acceptance. Every node slot gets a value with
the first-match factors of the higher-priority drafted children it *may* have (a lower bound when
they are not laid); those values never exceed their prerequisites', so the top-B slots form a valid
tree and are the optimum of that lower bound. The exact expectation of the result is compared with
the best single-spine tree (:func:`goose.planning.spine_tree.best_spine`) and the better one is
returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from goose.planning.grid import grid, per_depth, probability, rounded
from goose.planning.spine_tree import EPSILON, best_spine
from goose.planning.yield_model import TreeShape, branch_unit, branch_values, expected_tau_tree


@dataclass(frozen=True)
class SpineSpec:
    """One drafting source's spine for :func:`multi_spine_allocation`.

    acceptance: conditional acceptance per depth along this spine (1-based; the last value
    repeats). available: tokens its draft can lay (after the attach point). attach: the main-spine
    depth it hangs from (0 = the anchor); ignored for the main spine (the first spec).
    """

    acceptance: tuple[float, ...]
    available: int
    attach: int = 0


@dataclass(frozen=True)
class MultiSpineAllocation:
    """Node counts for a main spine, side spines and branches.

    lengths[k]: tokens spine k lays (main first). widths[0]: branch nodes at the anchor and main
    nodes 1..lengths[0] (lengths[0] + 1 entries); widths[k > 0]: at side-spine k's nodes
    1..lengths[k]. expected_tau: the model's exact expectation of the tree.
    """

    lengths: tuple[int, ...]
    widths: tuple[tuple[int, ...], ...]
    expected_tau: float

    @property
    def size(self) -> int:
        return sum(self.lengths) + sum(sum(w) for w in self.widths)


def multi_spine_allocation(
    spines: Sequence[SpineSpec], p_t: float, budget: int, max_depth: int = 6
) -> MultiSpineAllocation:
    """Split ``budget`` nodes between a main spine (``spines[0]``), side spines and branches (p_t) by expected yield.

    Estimates are rounded to the planning grid and the result cached: a planner may call this every cycle.
    """
    if not spines:
        raise ValueError("at least one spine (the main one) is needed")
    budget = max(0, int(budget))
    return _multi_spine(spine_keys(spines), grid(probability(p_t, "p_t")), budget, max(1, int(max_depth)))


SpineKey = tuple[tuple[float, ...], int, int]


def spine_keys(spines: Sequence[SpineSpec]) -> tuple[SpineKey, ...]:
    """The spines as the cache keys them: (acceptance on the grid, available tokens, attach point; main's 0)."""
    return tuple((rounded(s.acceptance), max(0, int(s.available)), 0 if k == 0 else max(0, int(s.attach)))
                 for k, s in enumerate(spines))


@lru_cache(maxsize=8192)
def _multi_spine(spines: tuple[SpineKey, ...], p_t: float, budget: int, max_depth: int) -> MultiSpineAllocation:
    unit_parents, unit = branch_unit(p_t, budget, max_depth)
    main_acceptance, main_available, _ = spines[0]
    main_cap = min(main_available, budget)
    q = [per_depth(acceptance, max(min(available, budget), 1)) for acceptance, available, _ in spines]
    lengths = [main_cap] + [min(available, budget) if attach <= main_cap else 0
                            for _, available, attach in spines[1:]]

    # reach of every spine node (conventional: every higher-priority drafted sibling is counted as laid)
    main_reach = np.concatenate([[1.0], np.cumprod(q[0][:main_cap])])
    reach = [main_reach]
    head_miss = np.ones(main_cap + 1)  # per main node: prod (1 - q) over the drafted children tried first
    head_miss[:main_cap] = 1.0 - q[0][:main_cap]
    for k in range(1, len(spines)):
        attach = spines[k][2]
        if lengths[k] == 0:
            reach.append(np.ones(1))
            continue
        base = main_reach[attach] * head_miss[attach]
        head_miss[attach] *= 1.0 - q[k][0]
        reach.append(np.concatenate([[1.0], base * np.cumprod(q[k][: lengths[k]])]))
    # sigma of each branch row: the node's reach times its drafted children's miss
    rows: list[np.ndarray] = [main_reach * head_miss]
    for k in range(1, len(spines)):
        r = reach[k][1:]
        miss = np.ones(r.shape[0])
        miss[:-1] = 1.0 - q[k][1 : r.shape[0]]
        rows.append(r * miss)

    # every slot, prerequisites first (main nodes, side nodes, then branch rows best-first)
    spine_values = [reach[0][1:]] + [reach[k][1:] if lengths[k] else np.zeros(0) for k in range(1, len(spines))]
    row_scales = np.concatenate(rows)
    branch_slots = branch_values(row_scales, unit, budget).ravel()
    values = np.concatenate([*spine_values, branch_slots])
    order = np.argsort(-values, kind="stable")[:budget]
    order = order[values[order] > 0.0]
    chosen = np.zeros(values.shape[0], dtype=bool)
    chosen[order] = True
    laid, start = [], 0
    for spine_value in spine_values:
        laid.append(int(chosen[start : start + spine_value.shape[0]].sum()))
        start += spine_value.shape[0]
    per_row = chosen[start:].reshape(row_scales.shape[0], -1).sum(axis=1) if unit.size else np.zeros(
        row_scales.shape[0], dtype=np.int64)
    widths: list[tuple[int, ...]] = []
    offset = 0
    for k, row in enumerate(rows):
        keep = laid[k] + 1 if k == 0 else laid[k]
        widths.append(tuple(int(w) for w in per_row[offset : offset + keep]))
        offset += row.shape[0]
    greedy = MultiSpineAllocation(tuple(laid), tuple(widths), 0.0)
    greedy = MultiSpineAllocation(greedy.lengths, greedy.widths,
                                  expected_tau_tree(multi_spine_shape(spines, p_t, greedy, unit_parents)))

    # the best tree without side spines, exact: the multi-source tree must never do worse
    single = best_spine(main_acceptance, main_cap, p_t, budget, max_depth)
    alone = MultiSpineAllocation((single.spine_len,) + (0,) * (len(spines) - 1),
                                 (single.widths,) + ((),) * (len(spines) - 1), single.expected_tau)
    return greedy if greedy.expected_tau > alone.expected_tau + EPSILON else alone


def multi_spine_shape(
    spines: tuple[SpineKey, ...], p_t: float, allocation: MultiSpineAllocation, unit_parents: np.ndarray
) -> TreeShape:
    """The tree an allocation describes, in walker priority: main spine, side spines in rank order, branches.

    ``spines`` as :func:`spine_keys` gives them, ``p_t`` on the grid, ``unit_parents`` the best-first
    branch's parents (:func:`goose.planning.yield_model.branch_unit`) of at least the largest share.
    """
    parents: list[int] = []
    acceptance: list[float] = []
    main = allocation.lengths[0]
    q = [per_depth(a, max(allocation.lengths[k], 1)) for k, (a, _, _) in enumerate(spines)]
    node_of: list[list[int]] = [[-1, *range(main)]]  # per spine: draft node of its depth d (main: anchor = -1)
    parents.extend(range(-1, main - 1))
    acceptance.extend(q[0][:main].tolist())
    for k in range(1, len(spines)):
        length = allocation.lengths[k]
        nodes = [node_of[0][spines[k][2]]] if length else []
        for d in range(length):
            parents.append(nodes[-1])
            acceptance.append(float(q[k][d]))
            nodes.append(len(parents) - 1)
        node_of.append(nodes)
    for k, widths in enumerate(allocation.widths):
        for i, share in enumerate(widths):
            start = node_of[k][i] if k == 0 else node_of[k][i + 1]
            base = len(parents)
            for parent in unit_parents[:share].tolist():
                parents.append(start if parent < 0 else base + parent)
                acceptance.append(p_t)
    return TreeShape(np.array(parents, dtype=np.int64), np.array(acceptance))
