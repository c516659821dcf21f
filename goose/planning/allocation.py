"""The budget split that maximises a tree's expected yield: what planners and the automatic budget run every cycle.

**Acceptance model** (arXiv 2604.02047, "Acceptance model and expected yield"). Every draft token is
correct with a fixed probability given that its parent was accepted, independently of everything
else: ``p_s`` for a spine (drafting-source) token, ``p_t`` for a transition (branch) token. The
walker goes down from the anchor and at every node follows the *first* correct child in priority
order (the spine child first, then the branches, best ranked first; that is the tree's index
order). tau = accepted draft tokens + 1 bonus token.

Under this model a node v lies on the accepted path with probability

    value(v) = value(parent) * q_v * prod_{earlier siblings s of v} (1 - q_s)        (value(anchor) = 1)

and, since the accepted nodes form one path, E[tau] = 1 + sum_v value(v) *exactly*
(:func:`expected_tau_tree`). Everything below is that sum for particular shapes.

**Optimal allocation** (:func:`best_spine_tree`). For a budget B the
search is over spine lengths m and over branch *node shares* w_i (node counts, what
``goose.topologies.toolkit.grow_branches`` takes as ``budgets``), each share shaped best-first within ``max_depth``
levels the way ``grow_branches`` shapes it. Under the model, a share of k nodes at spine node i is
worth sigma_i * (U_0 + ... + U_{k-1}), where U is the sorted list of node values of the best-first
transition tree (:func:`branch_unit`) and sigma_i = p_s^i (1 - p_s) (i < m) or p_s^m (i = m). For a
fixed m the best split of the B - m branch nodes is the top B - m values of the union of these
scaled lists (every list is non-increasing, so greedy merging is optimal), and every m is tried,
with a bound that stops once no longer spine can win. The result is the exact optimum over "a spine
plus best-first branch subtrees", a family that contains the pure chain (no branches) and the best
transition tree of depth <= max_depth (m = 0): that is the paper's non-degradation property.
Sibling values fall like (1 - p_t)^rank and depth costs a factor p_t, so while
p_t <= (1 - p_t)^(B-1) (p_t below ~0.045 at B = 60, the paper's whole range) the best share is
all heads, w_i = number of heads, l_bar = 0 and ``expected_tau_spine(p_s, p_t, m, widths)`` is the
optimum's value. The widths fall with depth (linearly: one step of spine depth costs
log(1/p_s) / log(1/(1-p_t)) branch nodes), the paper's "wide near the root".

**Several drafting sources** (:func:`multi_spine_allocation`): a main spine, side spines hanging
off main-spine nodes (where their drafts diverge), branches at every spine node, each spine with
its own per-depth acceptance. Every node slot gets a value with the first-match factors of the
higher-priority drafted children it *may* have (a lower bound when they are not laid); those values
never exceed their prerequisites', so the top-B slots form a valid tree and are the optimum of
that lower bound. The exact expectation of the result is compared with the best single-spine tree
and the better one is returned.

Optimisations are cached on estimates rounded to the planning grid
(:data:`goose.contract.acceptance.ALLOCATION_STEP`); planners call them every cycle. The paper's closed forms
and a Monte-Carlo check of these expectations are in :mod:`tests.theory`.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from goose.contract.acceptance import ALLOCATION_STEP, quantize, quantize_all

_EPSILON = 1e-12

__all__ = [
    "MultiSpineAllocation",
    "SpineAllocation",
    "SpineSpec",
    "TreeShape",
    "best_spine_tree",
    "branch_unit",
    "expected_tau_tree",
    "multi_spine_allocation",
    "node_values",
]


def _probability(value: float, name: str) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value}")
    return value


def _probabilities(values: object, name: str) -> np.ndarray:
    """:func:`_probability` for a sequence or array at once, as a flat float array."""
    array = np.asarray(values, dtype=np.float64).ravel()
    outside = array[~((array >= 0.0) & (array <= 1.0))]  # NaN counts as outside
    if outside.size:
        _probability(outside[0], name)  # raises, with the one message
    return array


# --- exact expectation of any tree ---------------------------------------------------------------


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


# --- best-first branches ------------------------------------------------------------------------


@lru_cache(maxsize=512)
def branch_unit(p_t: float, size: int, max_depth: int) -> tuple[np.ndarray, np.ndarray]:
    """The best-first transition tree of up to ``size`` nodes: (parents, values), values non-increasing.

    Node values are p_t (1 - p_t)^rank times the parent's value (first match among siblings), so a
    node's next sibling and first child never beat it and a heap pops them in value order; any
    prefix of the result is the best tree of that size (ancestor-closed). Values of zero are left
    out. Read-only arrays, cached.
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


def _heads(unit_parents: np.ndarray, shares: Sequence[int]) -> tuple[int, ...]:
    """First-level nodes among the first ``share`` nodes of a best-first branch, for every share."""
    heads = np.concatenate([[0], np.cumsum(unit_parents < 0)])
    return tuple(heads[np.minimum(shares, unit_parents.shape[0])].tolist())


# --- one spine: exact optimum -------------------------------------------------------------------


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


def _grid(value: float) -> float:
    """An estimate on the planning grid (the caches' key)."""
    return quantize(value, ALLOCATION_STEP)


def _rounded(acceptance: float | Sequence[float]) -> tuple[float, ...]:
    """Per-depth acceptance as a rounded tuple (a scalar is one depth that repeats)."""
    if isinstance(acceptance, float | int):  # the hot path: one estimate per source, every cycle
        return (_grid(_probability(acceptance, "acceptance")),)
    values = _probabilities(acceptance, "acceptance")  # per depth: one array operation, not a loop
    if not values.size:
        raise ValueError("acceptance needs at least one value")
    return tuple(quantize_all(values, ALLOCATION_STEP))


def _per_depth(acceptance: tuple[float, ...], length: int) -> np.ndarray:
    """Per-depth acceptance for depths 1..length (the last value repeats)."""
    values = list(acceptance[:length]) + [acceptance[-1]] * max(0, length - len(acceptance))
    return np.array(values, dtype=np.float64)


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
    return _best_spine(_rounded(p_s), spine_cap, _grid(_probability(p_t, "p_t")), budget, max(1, int(max_depth)))


@lru_cache(maxsize=8192)
def _best_spine(
    acceptance: tuple[float, ...], spine_cap: int, p_t: float, budget: int, max_depth: int
) -> SpineAllocation:
    unit_parents, unit = branch_unit(p_t, budget, max_depth)
    q = _per_depth(acceptance, spine_cap)
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
        if bound[m] <= best_tau + _EPSILON:
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
        if tau > best_tau + _EPSILON or (tau >= best_tau - _EPSILON and m < best_m):
            best_tau, best_m = tau, m
    scales = np.append(reach[:best_m] * (1.0 - q[:best_m]), reach[best_m])
    widths = _top_counts(scales, unit, budget - best_m)
    heads = _heads(unit_parents, widths)
    return SpineAllocation(best_m, widths, heads, best_tau)


def _candidates(scales: np.ndarray, unit: np.ndarray, count: int) -> np.ndarray:
    """[rows, columns]: the value of the k-th node of a best-first branch at each row (only the first count matter)."""
    return scales[:, None] * unit[None, : max(0, count)]


def _top_counts(scales: np.ndarray, unit: np.ndarray, count: int) -> tuple[int, ...]:
    """Nodes each row gets among the top ``count`` (ties: shallower row, then earlier node; zeros never)."""
    values = _candidates(scales, unit, count)
    rows = scales.shape[0]
    if count <= 0 or values.size == 0:
        return (0,) * rows
    flat = values.ravel()
    order = np.argsort(-flat, kind="stable")[:count]
    order = order[flat[order] > 0.0]
    return tuple(np.bincount(order // values.shape[1], minlength=rows).tolist())


# --- several drafting sources -------------------------------------------------------------------


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
    key = tuple(
        (_rounded(s.acceptance), max(0, int(s.available)), 0 if k == 0 else max(0, int(s.attach)))
        for k, s in enumerate(spines)
    )
    return _multi_spine(key, _grid(_probability(p_t, "p_t")), budget, max(1, int(max_depth)))


_SpineKey = tuple[tuple[float, ...], int, int]


@lru_cache(maxsize=8192)
def _multi_spine(spines: tuple[_SpineKey, ...], p_t: float, budget: int, max_depth: int) -> MultiSpineAllocation:
    unit_parents, unit = branch_unit(p_t, budget, max_depth)
    main_acceptance, main_available, _ = spines[0]
    main_cap = min(main_available, budget)
    q = [_per_depth(acceptance, max(min(available, budget), 1)) for acceptance, available, _ in spines]
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
    branch_values = _candidates(row_scales, unit, budget).ravel()
    values = np.concatenate([*spine_values, branch_values])
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
                                  expected_tau_tree(_multi_shape(spines, p_t, greedy, unit_parents)))

    # the best tree without side spines, exact: the multi-source tree must never do worse
    single = _best_spine(main_acceptance, main_cap, p_t, budget, max_depth)
    alone = MultiSpineAllocation((single.spine_len,) + (0,) * (len(spines) - 1),
                                 (single.widths,) + ((),) * (len(spines) - 1), single.expected_tau)
    return greedy if greedy.expected_tau > alone.expected_tau + _EPSILON else alone


def _multi_shape(
    spines: tuple[_SpineKey, ...], p_t: float, allocation: MultiSpineAllocation, unit_parents: np.ndarray
) -> TreeShape:
    """The tree an allocation describes, in walker priority: main spine, side spines in rank order, branches."""
    parents: list[int] = []
    acceptance: list[float] = []
    main = allocation.lengths[0]
    q = [_per_depth(a, max(allocation.lengths[k], 1)) for k, (a, _, _) in enumerate(spines)]
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
