"""DraftTree and TreeBuilder: parent arrays, (parent, token) dedup, budget, masks and positions."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from goose.tree import DraftTree, TreeBuilder, ancestor_matrix


def random_tree(parents_choice: list[int], tokens: list[int], budget: int) -> DraftTree:
    builder = TreeBuilder(anchor=7, source_names=("a", "b"), capacity=budget)
    for i, (choice, token) in enumerate(zip(parents_choice, tokens, strict=False)):
        parent = choice % builder.size
        builder.add_children(torch.tensor([parent]), torch.tensor([token]), source=i % 2)
    return builder.build()


tree_strategy = st.integers(1, 24).flatmap(
    lambda n: st.tuples(st.lists(st.integers(0, 1000), min_size=n, max_size=n),
                        st.lists(st.integers(0, 5), min_size=n, max_size=n), st.integers(1, 30))
)


def brute_ancestors(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    result = torch.zeros(n, n, dtype=torch.bool)
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
    assert bool((tree.parents[1:] < torch.arange(1, n)).all())
    # unique on (parent, token)
    keys = {(int(p), int(t)) for p, t in zip(tree.parents[1:], tree.tokens[1:], strict=True)}
    assert len(keys) == n - 1
    assert bool((tree.depths[1:] == tree.depths[tree.parents[1:]] + 1).all())
    assert torch.equal(tree.ancestors, brute_ancestors(tree.parents.tolist()))


@given(tree_strategy, st.integers(0, 40), st.integers(1, 16))
@settings(max_examples=100, deadline=None)
def test_mask_and_positions(spec: tuple[list[int], list[int], int], past: int, window: int) -> None:
    tree = random_tree(*spec)
    mask = tree.attention_mask(past)
    assert mask.shape == (1, 1, tree.size, past + tree.size) and mask.dtype == torch.bool
    assert bool(mask[0, 0, :, :past].all())
    assert torch.equal(mask[0, 0, :, past:], tree.ancestors)
    positions = tree.position_ids(past)
    assert torch.equal(positions[0], past + tree.depths)
    windowed = tree.attention_mask(past, sliding_window=window)[0, 0]
    for row in range(tree.size):
        q = past + int(tree.depths[row])
        expected = torch.tensor([q - k < window for k in range(past)], dtype=torch.bool)
        assert torch.equal(windowed[row, :past], expected)


def test_dedup_keeps_first_writer_and_chain_follows_existing_prefix() -> None:
    builder = TreeBuilder(anchor=1, source_names=("spine", "branch"), capacity=10)
    spine = builder.add_chain(0, torch.tensor([5, 6, 7]), source=0, spine=True)
    assert spine.tolist() == [1, 2, 3]
    # a branch proposing the spine's next token under the same parent reuses the spine node
    again = builder.add_children(torch.tensor([1, 1, 1]), torch.tensor([6, 9, 9]), source=1)
    assert again.tolist() == [2, 4, 4]
    tree = builder.build()
    assert tree.source_ids.tolist() == [-1, 0, 0, 0, 1]
    assert tree.on_spine.tolist() == [False, True, True, True, False]
    # a chain that shares the existing prefix 5, 6 then diverges
    builder2 = TreeBuilder(anchor=1, source_names=("x",), capacity=10)
    builder2.add_chain(0, torch.tensor([5, 6, 7]), source=0)
    follow = builder2.add_chain(0, torch.tensor([5, 6, 8, 9]), source=0)
    assert follow.tolist() == [1, 2, 4, 5]


def test_budget_is_respected() -> None:
    builder = TreeBuilder(anchor=1, source_names=("x",), capacity=4)
    laid = builder.add_chain(0, torch.arange(10, 20), source=0)
    assert laid.tolist() == [1, 2, 3, 4] and builder.room == 0
    assert builder.add_children(torch.tensor([0]), torch.tensor([99]), source=0).tolist() == [-1]


def test_ancestor_matrix_deep_chain() -> None:
    parents = torch.arange(-1, 40)
    assert torch.equal(ancestor_matrix(parents, 40), torch.tril(torch.ones(41, 41, dtype=torch.bool)))


def test_single_tree_is_the_anchor_alone() -> None:
    tree = DraftTree.single(3)
    assert tree.size == 1 and tree.tokens.tolist() == [3]
    assert tree.attention_mask(5).shape == (1, 1, 1, 6)
