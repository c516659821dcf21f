"""DraftTree and TreeBuilder: parent arrays, (parent, token) dedup, budget, masks and positions."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from goose.contract.tree import DraftTree, TreeBuilder, ancestor_matrix
from goose.cycle.verifier import pass_rows


def random_tree(parents_choice: list[int], tokens: list[int], budget: int) -> DraftTree:
    builder = TreeBuilder(anchor=7, source_names=("a", "b"), capacity=budget)
    for i, (choice, token) in enumerate(zip(parents_choice, tokens, strict=False)):
        parent = choice % builder.size
        builder.add_children(np.array([parent]), np.array([token]), source=i % 2)
    return builder.build()


tree_strategy = st.integers(1, 24).flatmap(
    lambda n: st.tuples(st.lists(st.integers(0, 1000), min_size=n, max_size=n),
                        st.lists(st.integers(0, 5), min_size=n, max_size=n), st.integers(1, 30))
)


def brute_ancestors(parents: list[int]) -> np.ndarray:
    n = len(parents)
    result = np.zeros((n, n), dtype=np.bool_)
    for i in range(n):
        node = i
        while node >= 0:
            result[i, node] = True
            node = parents[node]
    return result


@given(tree_strategy)
@settings(max_examples=200, deadline=None)
def test_tree_invariants(spec: tuple[list[int], list[int], int]) -> None:
    parents_choice, tokens, budget = spec
    tree = random_tree(parents_choice, tokens, budget)
    n = tree.size
    assert n <= budget + 1
    assert int(tree.parents[0]) == -1 and int(tree.tokens[0]) == 7
    assert bool((tree.parents[1:] < np.arange(1, n)).all())
    # unique on (parent, token)
    keys = {(int(p), int(t)) for p, t in zip(tree.parents[1:], tree.tokens[1:], strict=True)}
    assert len(keys) == n - 1
    assert bool((tree.depths[1:] == tree.depths[tree.parents[1:]] + 1).all())
    assert np.array_equal(tree.ancestors, brute_ancestors(tree.parents.tolist()))
    # previous token of each node: its parent's token, the context's for the anchor's children
    previous = tree.previous_tokens(anchor_previous=99)
    for node in range(1, n):
        parent = int(tree.parents[node])
        assert previous[node] == (tree.tokens[parent] if parent > 0 else 7)
    assert previous[0] == 99


@given(tree_strategy, st.integers(0, 40))
@settings(max_examples=100, deadline=None)
def test_pass_rows_of_a_tree(spec: tuple[list[int], list[int], int], past: int) -> None:
    tree = random_tree(*spec)
    tokens, positions, block = pass_rows(tree, past, ())
    assert np.array_equal(tokens, tree.tokens)
    assert np.array_equal(positions, past + tree.depths)
    assert np.array_equal(block, tree.ancestors)


def test_dedup_keeps_first_writer_and_chain_follows_existing_prefix() -> None:
    builder = TreeBuilder(anchor=1, source_names=("spine", "branch"), capacity=10)
    spine = builder.add_chain(0, np.array([5, 6, 7]), source=0, spine=True)
    assert spine.tolist() == [1, 2, 3]
    # a branch proposing the spine's next token under the same parent reuses the spine node
    again = builder.add_children(np.array([1, 1, 1]), np.array([6, 9, 9]), source=1)
    assert again.tolist() == [2, 4, 4]
    tree = builder.build()
    assert tree.source_ids.tolist() == [-1, 0, 0, 0, 1]
    assert tree.on_spine.tolist() == [False, True, True, True, False]
    # a chain that shares the existing prefix 5, 6 then diverges
    builder2 = TreeBuilder(anchor=1, source_names=("x",), capacity=10)
    builder2.add_chain(0, np.array([5, 6, 7]), source=0)
    follow = builder2.add_chain(0, np.array([5, 6, 8, 9]), source=0)
    assert follow.tolist() == [1, 2, 4, 5]


def test_budget_is_respected() -> None:
    builder = TreeBuilder(anchor=1, source_names=("x",), capacity=4)
    laid = builder.add_chain(0, np.arange(10, 20), source=0)
    assert laid.tolist() == [1, 2, 3, 4] and builder.room == 0
    assert builder.add_children(np.array([0]), np.array([99]), source=0).tolist() == [-1]


def test_ancestor_matrix_deep_chain() -> None:
    parents = np.arange(-1, 40)
    assert np.array_equal(ancestor_matrix(parents, 40), np.tril(np.ones((41, 41), dtype=np.bool_)))


def test_single_tree_is_the_anchor_alone() -> None:
    tree = DraftTree.single(3)
    assert tree.size == 1 and tree.tokens.tolist() == [3]
    assert tree.root_path(0).shape == (0,)
