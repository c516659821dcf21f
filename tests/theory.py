"""The paper's closed forms for the expected yield of a spine tree, and a Monte-Carlo check of the acceptance model.

The acceptance model, and the exact expectation E[tau] = 1 + sum_v value(v) of any tree under it,
are described in :mod:`goose.planning.allocation` (:func:`goose.planning.allocation.expected_tau_tree`); below are the
paper's special cases.

**The paper's bound** (:func:`expected_tau_spine`), spine of length m, w_i branches at spine node i
(node 0 = the anchor)::

    E[tau] >= sum_{i=1..m} p_s^i + sum_{i=0..m-1} p_s^i (1 - p_s) phi_i (1 + l_bar) + 1
    phi_i  = 1 - (1 - p_t)^{w_i}
    l_bar  = sum_{j=1..D-1} p_t^j = p_t (1 - p_t^{D-1}) / (1 - p_t)

p_s^i (1 - p_s) is "the spine reached node i and broke right after it"; phi_i is "one of the w_i
branch heads there is correct" (first match, so each head is worth p_t (1-p_t)^rank). l_bar is
the mean *extra* length a matched branch yields when every branch is its head plus the head's
top-successor chain down to D tokens (D = ``branch_depth``): each further token is accepted with
p_t given the one before, so P(extra >= j) = p_t^j for j < D. Such a tree has m + D * sum(w_i)
nodes (:func:`spine_tree_size`). The bound leaves out branches at the spine's last node; passing
``len(widths) == m + 1`` adds them, worth p_s^m phi_m (1 + l_bar) (no spine child left to fail
first). With that term the formula is the exact expectation of the model; without it, a lower
bound (tight when w_m = 0).

The optimum over spine trees and its multi-source generalisation, which planners and the automatic
budget use every cycle, are in :mod:`goose.planning.allocation`; this module holds the paper's closed forms,
the literal trees they describe and a Monte-Carlo check, against which the tests hold the optimiser.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from goose.planning import multi_spine
from goose.planning.allocation import (
    MultiSpineAllocation,
    SpineSpec,
    TreeShape,
    best_spine_tree,
    branch_unit,
    expected_tau_tree,
)
from goose.planning.grid import grid, probability

__all__ = [
    "expected_tau_chain",
    "expected_tau_spine",
    "expected_tau_transition_tree",
    "match_probability",
    "mean_branch_extra",
    "multi_spine_shape",
    "optimal_allocation",
    "simulate_tau",
    "spine_tree_shape",
    "spine_tree_size",
    "transition_tree_shape",
]


# --- the paper's closed forms ------------------------------------------------------------------


def match_probability(p_t: float, width: int) -> float:
    """phi = 1 - (1 - p_t)^width: one of ``width`` branch heads is correct (first match)."""
    return 1.0 - (1.0 - probability(p_t, "p_t")) ** width


def mean_branch_extra(p_t: float, branch_depth: int) -> float:
    """l_bar = sum_{j=1..D-1} p_t^j: mean extra tokens after a matched head whose branch is D tokens deep.

    Below its head a branch follows the top successor; each further token is accepted with p_t given
    the previous one, so the extra length L has P(L >= j) = p_t^j for j < D and E[L] is the sum.
    """
    p_t = probability(p_t, "p_t")
    return sum(p_t**j for j in range(1, max(1, branch_depth)))


def expected_tau_spine(
    p_s: float, p_t: float, spine_len: int, widths: Sequence[int], branch_depth: int = 1
) -> float:
    """The paper's bound on E[tau] for a spine of ``spine_len`` and ``widths[i]`` branches at spine node i.

    ``widths`` has ``spine_len`` entries (the anchor, then spine nodes 1..m-1: the paper's sum) or
    ``spine_len + 1`` (also the last spine node, whose branches continue past the spine). Each
    branch is ``branch_depth`` tokens deep; see the module docstring for the derivation.
    """
    p_s, p_t = probability(p_s, "p_s"), probability(p_t, "p_t")
    m = int(spine_len)
    widths = [int(w) for w in widths]
    if m < 0 or len(widths) not in (m, m + 1) or any(w < 0 for w in widths):
        raise ValueError(f"widths must hold {m} or {m + 1} non-negative entries for a spine of {m}, got {widths}")
    gain = 1.0 + mean_branch_extra(p_t, branch_depth)
    tau = 1.0 + sum(p_s**i for i in range(1, m + 1))
    tau += sum(p_s**i * (1.0 - p_s) * match_probability(p_t, w) * gain for i, w in enumerate(widths[:m]))
    if len(widths) == m + 1:
        tau += p_s**m * match_probability(p_t, widths[m]) * gain
    return tau


def expected_tau_chain(p_s: float, m: int) -> float:
    """A pure chain of m tokens (Prompt Lookup Decoding): 1 + sum_{i=1..m} p_s^i."""
    return expected_tau_spine(p_s, 0.0, m, [0] * m)


def spine_tree_size(spine_len: int, widths: Sequence[int], branch_depth: int = 1) -> int:
    """Draft nodes of the tree :func:`expected_tau_spine` describes: m + D * sum(w_i)."""
    return int(spine_len) + int(branch_depth) * int(sum(widths))


# --- Monte Carlo and literal shapes ------------------------------------------------------------


def simulate_tau(shape: TreeShape, samples: int = 100_000, seed: int = 0) -> tuple[float, float]:
    """Monte-Carlo (mean tau, standard error): draw every node's correctness, walk by first match."""
    n = len(shape)
    generator = np.random.default_rng(seed)
    correct = generator.random((samples, n)) < shape.acceptance[None, :]
    on_path = np.zeros((samples, n), dtype=bool)
    matched = np.zeros((samples, n + 1), dtype=bool)  # per parent (+1): an earlier child was correct
    for node, parent in enumerate(shape.parents.tolist()):
        reached = True if parent < 0 else on_path[:, parent]
        on_path[:, node] = reached & correct[:, node] & ~matched[:, parent + 1]
        matched[:, parent + 1] |= correct[:, node]
    tau = 1.0 + on_path.sum(axis=1)
    return float(tau.mean()), float(tau.std() / math.sqrt(samples))


def spine_tree_shape(p_s: float, p_t: float, spine_len: int, widths: Sequence[int], branch_depth: int = 1) -> TreeShape:
    """The literal tree :func:`expected_tau_spine` describes (spine first, then each branch's head and chain)."""
    m = int(spine_len)
    parents = list(range(-1, m - 1))
    acceptance = [p_s] * m
    for i, width in enumerate(widths):
        for _ in range(int(width)):
            parent = i - 1  # spine node i is draft node i - 1; the anchor is -1
            for _ in range(branch_depth):
                parents.append(parent)
                acceptance.append(p_t)
                parent = len(parents) - 1
    return TreeShape(np.array(parents), np.array(acceptance))


def transition_tree_shape(levels: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Parent array of a level template (``transition_tree.static_template``: per level, parent slot and rank).

    Slots of a level are sorted by path, so siblings come in rank order: the walker's priority.
    """
    parents: list[np.ndarray] = []
    level_start, previous_start = 0, 0  # draft-node index of this level's and the previous level's first slot
    for depth, (parent_slots, _ranks) in enumerate(levels):
        slots = np.asarray(parent_slots, dtype=np.int64)
        parents.append(np.full(slots.shape[0], -1, dtype=np.int64) if depth == 0 else previous_start + slots)
        previous_start, level_start = level_start, level_start + slots.shape[0]
    return np.concatenate(parents) if parents else np.zeros(0, dtype=np.int64)


def expected_tau_transition_tree(p_t: float, shape: Sequence[int] | np.ndarray | Sequence[tuple]) -> float:
    """E[tau] of a transition-only tree (every node p_t): ``shape`` is a parent array or a level template."""
    p_t = probability(p_t, "p_t")
    if len(shape) and isinstance(shape[0], tuple):
        shape = transition_tree_shape(shape)  # type: ignore[arg-type]
    parents = np.asarray(shape, dtype=np.int64)
    return expected_tau_tree(parents, np.full(parents.shape[0], p_t))


def optimal_allocation(
    p_s: float | Sequence[float], p_t: float, budget: int, max_depth: int = 6, max_spine: int | None = None
) -> tuple[int, tuple[int, ...]]:
    """(spine length, branch node shares per spine node, anchor first, spine end last) maximising E[tau]."""
    best = best_spine_tree(p_s, p_t, budget, max_depth, max_spine)
    return best.spine_len, best.widths


def multi_spine_shape(spines: Sequence[SpineSpec], p_t: float, allocation: MultiSpineAllocation,
                      max_depth: int = 6) -> TreeShape:
    """The tree a :class:`MultiSpineAllocation` describes (for Monte Carlo and inspection)."""
    budget = max(1, allocation.size)
    unit_parents, _ = branch_unit(grid(p_t), budget, max_depth)
    return multi_spine.multi_spine_shape(multi_spine.spine_keys(spines), grid(p_t), allocation, unit_parents)
