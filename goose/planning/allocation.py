"""The budget split that maximises a tree's expected yield: what planners and the automatic budget run every cycle.

This module is the overview and the one import of the planning optimisers; each concept lives in its
own module: the acceptance model and exact tree expectations (:mod:`goose.planning.yield_model`),
the best spine tree for one budget or many (:mod:`goose.planning.spine_tree`), several drafting
sources (:mod:`goose.planning.multi_spine`), and the estimates as the caches key them
(:mod:`goose.planning.grid`).

**Acceptance model** (arXiv 2604.02047, "Acceptance model and expected yield"). Every draft token is
correct with a fixed probability given that its parent was accepted, independently of everything
else: ``p_s`` for a spine (drafting-source) token, ``p_t`` for a transition (branch) token. The
walker goes down from the anchor and at every node follows the *first* correct child in priority
order (the spine child first, then the branches, best ranked first; that is the tree's index
order). tau = accepted draft tokens + 1 bonus token.

Under this model a node v lies on the accepted path with probability

    value(v) = value(parent) * q_v * prod_{earlier siblings s of v} (1 - q_s)        (value(anchor) = 1)

and, since the accepted nodes form one path, E[tau] = 1 + sum_v value(v) *exactly*
(:func:`goose.planning.yield_model.expected_tau_tree`). Everything below is that sum for particular shapes.

**Optimal allocation** (:func:`best_spine_tree`; :func:`spine_yields` for many budgets at once). For a budget B the
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

from goose.planning.multi_spine import MultiSpineAllocation, SpineSpec, multi_spine_allocation
from goose.planning.spine_tree import SpineAllocation, best_spine_tree, spine_yields
from goose.planning.yield_model import TreeShape, branch_unit, expected_tau_tree, node_values

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
    "spine_yields",
]
