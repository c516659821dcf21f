"""The best spine tree within a budget: one drafting source's spine plus best-first branches.

For a budget B the search is over spine lengths m and over branch *node shares* w_i (node counts,
what ``goose.topologies.toolkit.grow_branches`` takes as ``budgets``), each share shaped best-first
within ``max_depth`` levels. Under the acceptance model (:mod:`goose.planning.yield_model`) a share
of k nodes at spine node i is worth sigma_i * (U_0 + ... + U_{k-1}), where U is the sorted list of
node values of the best-first transition tree and sigma_i = R_i (1 - q_{i+1}) (i < m) or R_m
(i = m), R_i the spine's reach at node i. For a fixed m the best split of the B - m branch nodes is
the top B - m values of the union of these scaled lists (every list is non-increasing, so greedy
merging is optimal), and every m is tried, with a bound that stops once no other spine length can
win. :func:`best_spine_tree` gives the tree for one budget (what the spine topology lays);
:func:`spine_yields` gives the optimum's expected yield for many budgets in one pass (what the
automatic budget compares every cycle).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from goose.planning.grid import grid, per_depth, probability, rounded
from goose.planning.yield_model import branch_heads, branch_unit, branch_values

EPSILON = 1e-12  # expectations this close are equal (the shorter spine wins the tie)


@dataclass(frozen=True)
class SpineAllocation:
    """A spine tree: ``spine_len`` spine tokens, ``widths[i]`` branch nodes at spine node i (0 = anchor).

    ``widths`` has spine_len + 1 entries; the last is the spine end's share. ``heads[i]`` of a
    share are first-level branch nodes (the rest sit deeper, best first). ``expected_tau`` is the
    model's exact expectation for this tree.
    """

    spine_len: int
    widths: tuple[int, ...]
    heads: tuple[int, ...]
    expected_tau: float

    @property
    def size(self) -> int:
        return self.spine_len + sum(self.widths)


def best_spine_tree(
    p_s: float | Sequence[float], p_t: float, budget: int, max_depth: int = 6, max_spine: int | None = None
) -> SpineAllocation:
    """The spine tree with the highest expected yield within ``budget`` draft nodes.

    ``p_s`` may be per depth (a sequence; its last value repeats). ``max_spine`` caps the spine (the
    draft's length); ``max_depth`` caps each branch's depth below its spine node. Estimates are
    rounded to the planning grid and the result cached.
    """
    budget = max(0, int(budget))
    spine_cap = budget if max_spine is None else max(0, min(budget, int(max_spine)))
    return best_spine(rounded(p_s), spine_cap, grid(probability(p_t, "p_t")), budget, max(1, int(max_depth)))


@lru_cache(maxsize=8192)
def best_spine(acceptance: tuple[float, ...], spine_cap: int, p_t: float, budget: int,
               max_depth: int) -> SpineAllocation:
    """:func:`best_spine_tree` on estimates already on the grid (the cached optimiser)."""
    unit_parents, unit = branch_unit(p_t, budget, max_depth)
    q = per_depth(acceptance, spine_cap)
    reach = np.concatenate([[1.0], np.cumprod(q)])  # R_i, i = 0..M
    spine_sum = np.concatenate([[0.0], np.cumsum(reach[1:])]).tolist()  # sum_{i=1..m} R_i
    # the value of the k-th best-first branch node at row i while the spine continues past i
    # (sigma_i = R_i (1 - q_{i+1})); the end row m has sigma = R_m
    interior = (reach[:-1] * (1.0 - q))[:, None] * unit[None, :]
    buffer = np.empty(interior.size + unit.size)
    unit_total, reach_list = float(unit.sum()), reach.tolist()
    # Upper bound of E(m) for every m, to try the promising spine lengths first and stop early:
    # the branches of rows < m are at most the best (budget - m) interior values of *any* rows,
    # and the end row's at most reach[m] times a whole best-first branch.
    best_interior = interior.ravel()
    if best_interior.size > budget:
        best_interior = np.partition(best_interior, best_interior.size - budget)[best_interior.size - budget :]
    interior_prefix = np.concatenate([[0.0], np.cumsum(np.sort(best_interior)[::-1])])
    interior_prefix = np.concatenate([interior_prefix, np.full(budget + 1, interior_prefix[-1])])
    lengths = np.arange(spine_cap + 1)
    bound = 1.0 + np.asarray(spine_sum) + interior_prefix[budget - lengths] + reach * unit_total
    best_tau, best_m = -1.0, 0
    for m in np.argsort(-bound, kind="stable").tolist():
        if bound[m] <= best_tau + EPSILON:
            break
        take = budget - m  # branch nodes left
        columns = min(take, unit.size)  # only a row's first `take` nodes can be among the top `take`
        size = (m + 1) * columns
        buffer[: m * columns] = interior[:m, :columns].ravel()
        buffer[m * columns : size] = unit[:columns] * reach_list[m]
        if size > take:  # the top `take` values; partition beats a sort on these few hundred
            top = float(np.partition(buffer[:size], size - take)[size - take : size].sum())
        else:
            top = float(buffer[:size].sum())
        tau = 1.0 + spine_sum[m] + top
        if tau > best_tau + EPSILON or (tau >= best_tau - EPSILON and m < best_m):
            best_tau, best_m = tau, m
    scales = np.append(reach[:best_m] * (1.0 - q[:best_m]), reach[best_m])
    widths = top_counts(scales, unit, budget - best_m)
    heads = branch_heads(unit_parents, widths)
    return SpineAllocation(best_m, widths, heads, best_tau)


def spine_yields(p_s: float | Sequence[float], p_t: float, budgets: Sequence[int],
                 spine_caps: Sequence[int] | None = None, max_depth: int = 6) -> np.ndarray:
    """E[tau] of the best spine tree for every budget, in one pass: ``best_spine_tree(...).expected_tau`` each.

    ``spine_caps[j]`` caps the spine at budget ``budgets[j]`` (None: no cap but the budget). The
    spine lengths, the reach along the spine and the branch values are worked out once for the
    largest budget; each spine length that may win for some budget is then scored for all the
    budgets it may win at with one sort of its candidate branch values. Equal to the per-budget
    optimum up to the order of summation.
    """
    budget_key = tuple(max(0, int(b)) for b in budgets)
    caps = budget_key if spine_caps is None else tuple(
        max(0, min(b, int(c))) for b, c in zip(budget_key, spine_caps, strict=True))
    yields = _spine_yields(rounded(p_s), grid(probability(p_t, "p_t")), budget_key, caps, max(1, int(max_depth)))
    return yields.copy()


@lru_cache(maxsize=4096)
def _spine_yields(acceptance: tuple[float, ...], p_t: float, budgets: tuple[int, ...], caps: tuple[int, ...],
                  max_depth: int) -> np.ndarray:
    if not budgets:
        return np.zeros(0)
    budget = np.asarray(budgets, dtype=np.int64)
    longest = max(caps)
    _, unit = branch_unit(p_t, int(budget.max()), max_depth)  # each budget's own unit is a prefix of it
    q = per_depth(acceptance, longest)
    reach = np.concatenate([[1.0], np.cumprod(q)])
    spine_sum = np.concatenate([[0.0], np.cumsum(reach[1:])])
    interior = (reach[:-1] * (1.0 - q))[:, None] * unit[None, :]  # [longest, unit]: rows 0..longest-1
    # The bound of budget b at spine length m, as in best_spine: the best (b - m) interior values of
    # any row, plus the end row's best (b - m) branch values.
    flat = interior.ravel()
    most = int(budget.max())
    if flat.size > most:
        flat = np.partition(flat, flat.size - most)[flat.size - most :]
    interior_prefix = np.zeros(most + 1)
    interior_prefix[1 : flat.size + 1] = np.cumsum(np.sort(flat)[::-1])
    interior_prefix[flat.size + 1 :] = interior_prefix[flat.size]
    unit_prefix = np.concatenate([[0.0], np.cumsum(unit)])
    lengths = np.arange(longest + 1)
    take = budget[:, None] - lengths[None, :]  # [budgets, lengths]: branch nodes left
    allowed = lengths[None, :] <= np.asarray(caps)[:, None]
    take = np.where(allowed, take, 0)
    bound = np.where(allowed, 1.0 + spine_sum[None, :] + interior_prefix[take]
                     + reach[None, :] * unit_prefix[np.minimum(take, unit.size)], -np.inf)
    best = np.full(budget.shape[0], -np.inf)
    scored = ~allowed
    while True:
        pending = ~scored & (bound > best[:, None] + EPSILON)
        if not pending.any():
            return best
        # every budget's most promising unscored length; one sort per length serves all its budgets
        for m in np.unique(np.where(pending, bound, -np.inf).argmax(axis=1)[pending.any(axis=1)]).tolist():
            rows = np.flatnonzero(pending[:, m])
            left = take[rows, m]
            columns = min(int(left.max()), unit.size)
            values = np.concatenate([interior[:m, :columns].ravel(), unit[:columns] * reach[m]])
            needed = min(int(left.max()), values.size)
            if values.size > needed:  # only the best `needed` values can count: partition, then sort those
                values = np.partition(values, values.size - needed)[values.size - needed :]
            prefix = np.concatenate([[0.0], np.cumsum(np.sort(values)[::-1])])
            tau = 1.0 + spine_sum[m] + prefix[np.minimum(left, values.size)]
            best[rows] = np.maximum(best[rows], tau)
            scored[rows, m] = True


def top_counts(scales: np.ndarray, unit: np.ndarray, count: int) -> tuple[int, ...]:
    """Nodes each row gets among the top ``count`` (ties: shallower row, then earlier node; zeros never)."""
    values = branch_values(scales, unit, count)
    rows = scales.shape[0]
    if count <= 0 or values.size == 0:
        return (0,) * rows
    flat = values.ravel()
    order = np.argsort(-flat, kind="stable")[:count]
    order = order[flat[order] > 0.0]
    return tuple(np.bincount(order // values.shape[1], minlength=rows).tolist())
