"""The expected-yield model: the paper's formula, exact tree expectations, the optimal split, Monte Carlo."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from goose.contract.candidates import without_trailing_repeats
from goose.planning import allocation as planning
from goose.planning.allocation import MultiSpineAllocation, SpineSpec, TreeShape
from goose.topologies.transition_tree import static_template
from tests import theory

P_S = [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 0.95]
P_T = [0.01, 0.03, 0.05, 0.1, 0.3]
BUDGETS = [1, 8, 16, 60]


def spine_shape(p_s: float, p_t: float, allocation: planning.SpineAllocation, max_depth: int = 6) -> TreeShape:
    """The tree of a single-spine allocation: spine, then best-first branches at every spine node."""
    multi = MultiSpineAllocation((allocation.spine_len,), (allocation.widths,), allocation.expected_tau)
    return theory.multi_spine_shape([SpineSpec((p_s,), allocation.spine_len)], p_t, multi, max_depth)


# --- closed forms -------------------------------------------------------------------------------


def test_chain_is_a_geometric_sum() -> None:
    assert theory.expected_tau_chain(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert theory.expected_tau_chain(0.3, 0) == 1.0
    assert theory.expected_tau_chain(1.0, 7) == 8.0


@pytest.mark.parametrize("p_t", [0.0, 0.04, 0.5, 1.0])
@pytest.mark.parametrize("depth", [1, 2, 6])
def test_mean_branch_extra_is_the_truncated_geometric_series(p_t: float, depth: int) -> None:
    expected = depth - 1 if p_t == 1.0 else p_t * (1 - p_t ** (depth - 1)) / (1 - p_t)
    assert theory.mean_branch_extra(p_t, depth) == pytest.approx(expected)


def test_the_paper_formula_term_by_term() -> None:
    p_s, p_t, widths = 0.4, 0.05, [5, 3, 1]
    phi = [1 - (1 - p_t) ** w for w in widths]
    l_bar = p_t + p_t**2  # branch depth 3
    expected = (0.4 + 0.4**2 + 0.4**3) + sum(p_s**i * (1 - p_s) * phi[i] * (1 + l_bar) for i in range(3)) + 1
    assert theory.expected_tau_spine(p_s, p_t, 3, widths, branch_depth=3) == pytest.approx(expected)
    # the spine end's branches: p_s^m phi_m (1 + l_bar), no spine child left to fail first
    with_end = theory.expected_tau_spine(p_s, p_t, 3, [*widths, 4], branch_depth=3)
    assert with_end - expected == pytest.approx(p_s**3 * (1 - (1 - p_t) ** 4) * (1 + l_bar))
    assert theory.spine_tree_size(3, [*widths, 4], branch_depth=3) == 3 + 3 * 13


@pytest.mark.parametrize(("p_s", "p_t", "widths", "depth"),
                         [(0.5, 0.04, [10, 4, 2, 1], 1), (0.3, 0.3, [3, 2, 1, 0], 3), (0.9, 0.1, [0, 0, 2, 5], 2)])
def test_formula_with_the_end_term_is_the_exact_expectation(p_s: float, p_t: float, widths: list[int],
                                                            depth: int) -> None:
    m = len(widths) - 1
    shape = theory.spine_tree_shape(p_s, p_t, m, widths, depth)
    assert len(shape) == theory.spine_tree_size(m, widths, depth)
    exact = planning.expected_tau_tree(shape)
    assert theory.expected_tau_spine(p_s, p_t, m, widths, depth) == pytest.approx(exact, abs=1e-12)
    # the paper's sum stops at m - 1: a lower bound, tight only without branches at the spine end
    assert theory.expected_tau_spine(p_s, p_t, m, widths[:m], depth) <= exact + 1e-12


def test_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match="probability"):
        theory.expected_tau_spine(1.2, 0.1, 1, [1])
    with pytest.raises(ValueError, match="entries"):
        theory.expected_tau_spine(0.5, 0.1, 3, [1])
    with pytest.raises(ValueError, match="parents"):
        TreeShape(np.array([0]), np.array([0.5]))
    with pytest.raises(ValueError, match="probability"):
        theory.optimal_allocation(0.5, -0.1, 10)


def test_transition_template_shape_keeps_siblings_in_rank_order() -> None:
    levels = static_template(60, 10, 6)
    parents = theory.transition_tree_shape(levels)
    assert parents.shape == (60,)
    assert ((parents >= -1) & (parents < np.arange(60))).all()
    assert (parents[: levels[0][0].shape[0]] == -1).all()
    # every level's slots are grouped by parent (paths sorted), so the parent array never decreases
    assert (np.diff(parents) >= 0).all()


# --- the optimal allocation ---------------------------------------------------------------------


@pytest.mark.parametrize("budget", BUDGETS)
def test_non_degradation_over_a_grid(budget: int) -> None:
    """The optimal spine tree is never worse than the pure chain or a pure transition tree of the same budget."""
    template = static_template(budget, 10, 6)
    for p_s in P_S:
        for p_t in P_T:
            best = planning.best_spine_tree(p_s, p_t, budget)
            assert best.size <= budget
            chain = theory.expected_tau_chain(p_s, budget)
            tr_tree = theory.expected_tau_transition_tree(p_t, template)
            fan = theory.expected_tau_transition_tree(p_t, [-1] * budget)
            assert best.expected_tau >= max(chain, tr_tree, fan) - 1e-9, (p_s, p_t, budget)
            if p_s > p_t and budget >= 2:  # anisotropic dominance: strictly better than any transition tree
                assert best.expected_tau > max(tr_tree, fan), (p_s, p_t, budget)


@pytest.mark.parametrize("p_s", P_S)
@pytest.mark.parametrize("p_t", [0.01, 0.03, 0.05])
def test_widths_fall_with_depth(p_s: float, p_t: float) -> None:
    """Wide near the root, narrow deep down: one spine step costs log(1/p_s)/log(1/(1-p_t)) branch nodes."""
    best = planning.best_spine_tree(p_s, p_t, 60)
    m, widths = best.spine_len, best.widths
    interior = widths[:m]
    assert all(a >= b for a, b in itertools.pairwise(interior)), widths
    step = math.log(1 / p_s) / math.log(1 / (1 - p_t))
    for a, b in itertools.pairwise(interior):
        if a and b:
            assert abs((a - b) - step) <= 1.0 + 1e-9, (widths, step)
    if p_t <= (1 - p_t) ** 59:  # depth never pays: every branch node is a head, l_bar = 0 (the paper's phi_i)
        assert best.heads == widths
        assert theory.expected_tau_spine(p_s, p_t, m, widths) == pytest.approx(best.expected_tau)


@pytest.mark.parametrize(("p_s", "p_t"), [(0.1, 0.04), (0.5, 0.04), (0.9, 0.04), (0.5, 0.3), (0.0, 0.05)])
def test_monotonic_in_budget(p_s: float, p_t: float) -> None:
    values = [planning.best_spine_tree(p_s, p_t, budget).expected_tau for budget in range(0, 81)]
    assert values[0] == 1.0
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(values))


def test_spine_cap_and_degenerate_estimates() -> None:
    assert theory.optimal_allocation(0.6, 0.04, 60, max_spine=3)[0] <= 3
    spine_len, widths = theory.optimal_allocation(0.0, 0.04, 20)  # no trustworthy draft: a pure transition tree
    assert spine_len == 0 and widths == (20,)
    spine_len, widths = theory.optimal_allocation(0.7, 0.0, 20)  # no branches worth a node: a pure chain
    assert spine_len == 20 and sum(widths) == 0
    assert theory.optimal_allocation(0.5, 0.04, 0) == (0, (0,))


def test_deep_branches_when_transitions_are_good() -> None:
    """With p_t high enough, depth pays: the shares hold more nodes than heads (l_bar > 0)."""
    best = planning.best_spine_tree(0.3, 0.3, 60)
    assert sum(best.widths) > sum(best.heads)
    shape = spine_shape(0.3, 0.3, best)
    assert planning.expected_tau_tree(shape) == pytest.approx(best.expected_tau)


@pytest.mark.parametrize(("p_s", "p_t", "budget"), [(0.5, 0.04, 60), (0.2, 0.05, 16), (0.8, 0.3, 30), (0.3, 0.3, 60)])
def test_matches_monte_carlo(p_s: float, p_t: float, budget: int) -> None:
    best = planning.best_spine_tree(p_s, p_t, budget)
    shape = spine_shape(p_s, p_t, best)
    assert len(shape) == best.size
    simulated, error = theory.simulate_tau(shape, samples=200_000, seed=1)
    assert abs(simulated - best.expected_tau) < 5 * error + 1e-3
    # the paper's bound (heads only, no spine-end term) never exceeds the simulation
    bound = theory.expected_tau_spine(p_s, p_t, best.spine_len, best.heads[: best.spine_len])
    assert simulated >= bound - 5 * error


def test_literal_formula_tree_matches_monte_carlo() -> None:
    shape = theory.spine_tree_shape(0.4, 0.2, 4, [6, 3, 2, 1, 2], branch_depth=3)
    simulated, error = theory.simulate_tau(shape, samples=200_000, seed=2)
    assert abs(simulated - theory.expected_tau_spine(0.4, 0.2, 4, [6, 3, 2, 1, 2], branch_depth=3)) < 5 * error


def test_allocations_are_cached_per_grid_cell() -> None:
    """The planner calls this every cycle: estimates on one grid cell share the cached optimum."""
    first = planning.best_spine_tree(0.5, 0.04, 60)
    assert planning.best_spine_tree(0.50004, 0.04003, 60) is first  # same grid cell: the cached object
    assert planning.best_spine_tree(0.52, 0.04, 60) is not first


# --- several drafting sources -------------------------------------------------------------------


MULTI_CASES = [
    ([SpineSpec((0.5,), 20), SpineSpec((0.3,), 6, attach=0)], 0.04, 60),
    ([SpineSpec((0.5,), 20), SpineSpec((0.3,), 6, attach=3)], 0.04, 16),
    ([SpineSpec((0.6,), 20), SpineSpec((0.45,), 6, attach=0), SpineSpec((0.3,), 6, attach=2)], 0.04, 30),
    ([SpineSpec((0.9, 0.5), 20), SpineSpec((0.3,), 6)], 0.0, 16),
    ([SpineSpec((0.2,), 20), SpineSpec((0.15,), 6)], 0.3, 40),
]


@pytest.mark.parametrize(("spines", "p_t", "budget"), MULTI_CASES)
def test_multi_spine_allocation(spines: list[SpineSpec], p_t: float, budget: int) -> None:
    allocation = planning.multi_spine_allocation(spines, p_t, budget)
    assert allocation.size <= budget
    assert len(allocation.lengths) == len(spines) and len(allocation.widths[0]) == allocation.lengths[0] + 1
    for spine, length in zip(spines, allocation.lengths, strict=True):
        assert length <= spine.available
    # never worse than the best single-spine tree (non-degradation for an extra source)
    alone = planning.best_spine_tree(spines[0].acceptance, p_t, budget, max_spine=spines[0].available)
    assert allocation.expected_tau >= alone.expected_tau - 1e-12
    shape = theory.multi_spine_shape(spines, p_t, allocation)
    assert len(shape) == allocation.size
    assert planning.expected_tau_tree(shape) == pytest.approx(allocation.expected_tau)
    simulated, error = theory.simulate_tau(shape, samples=100_000, seed=3)
    assert abs(simulated - allocation.expected_tau) < 5 * error + 1e-3


def test_side_spines_are_laid_when_they_pay_and_not_otherwise() -> None:
    good = planning.multi_spine_allocation([SpineSpec((0.5,), 20), SpineSpec((0.4,), 6)], 0.04, 30)
    assert good.lengths[1] > 0
    assert good.expected_tau > planning.best_spine_tree(0.5, 0.04, 30).expected_tau
    useless = planning.multi_spine_allocation([SpineSpec((0.5,), 20), SpineSpec((0.0,), 6)], 0.04, 30)
    assert useless.lengths[1] == 0
    # a side spine cannot hang below the end of the main draft
    beyond = planning.multi_spine_allocation([SpineSpec((0.5,), 2), SpineSpec((0.4,), 6, attach=5)], 0.04, 30)
    assert beyond.lengths[1] == 0


def test_a_per_depth_sequence_loses_only_trailing_repeats() -> None:
    assert without_trailing_repeats([0.5, 0.9, 0.9, 0.9]) == (0.5, 0.9)
    assert without_trailing_repeats([0.9, 0.5, 0.9]) == (0.9, 0.5, 0.9)
    assert without_trailing_repeats([0.7, 0.7]) == (0.7,)
    assert without_trailing_repeats([]) == ()
    # the shortest form plans the same tree as the long one
    long, short = [0.6, 0.6, 0.95, 0.95, 0.95], without_trailing_repeats([0.6, 0.6, 0.95, 0.95, 0.95])
    assert planning.best_spine_tree(long, 0.1, 16) == planning.best_spine_tree(short, 0.1, 16)
