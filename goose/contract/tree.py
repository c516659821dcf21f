"""The draft tree: a parent array of draft tokens hanging off the anchor, in NumPy.

Node 0 is the anchor (the last accepted token, not yet in the KV cache); every other node is a
draft token whose parent precedes it, so index order is a topological order. Nodes are unique
on (parent, token): when two sources propose the same token under the same parent the node is
kept once and keeps the tag of whoever laid it first, which is how a planner that lays the most
trusted source first gets "prefer context match over transition" in the walk for free.

The tree lives on the host from the sources to the walk; the verifier sends it to the model's
device once per cycle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


class CandidateError(ValueError):
    """A plugin returned a malformed draft, successor table or tree."""


ROOT = 0
NO_PARENT = -1
NO_SOURCE = -1


def kept_parents(parents: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The parents of the nodes where ``keep`` is True, re-indexed among them (a root stays -1); every kept
    node's parent must be kept too."""
    index = np.cumsum(keep) - 1  # a kept node's new index
    return np.where(parents >= 0, index[np.maximum(parents, 0)], NO_PARENT)[keep].astype(np.int64)


def ancestor_matrix(parents: np.ndarray, max_depth: int) -> np.ndarray:
    """bool [n, n] ancestor-or-self matrix by pointer jumping: ceil(log2(depth + 1)) array steps."""
    n = parents.shape[0]
    jump = np.maximum(parents, 0)  # the root is its own parent, so jumping past it stays there
    ancestors = np.eye(n, dtype=np.bool_)
    for _ in range(max(1, math.ceil(math.log2(max_depth + 1)))):
        # rows cover distances [0, 2^k); adding the rows of the 2^k-th ancestor covers [0, 2^(k+1))
        ancestors = ancestors | ancestors[jump]
        jump = jump[jump]
    return ancestors


def tokens_before(parents: np.ndarray, tokens: np.ndarray, nodes: np.ndarray, anchor_previous: int) -> np.ndarray:
    """The token before each of ``nodes`` on its root path (the anchor's is the context's previous token)."""
    node_parents = parents[nodes]
    return np.where(node_parents >= 0, tokens[np.maximum(node_parents, 0)], anchor_previous)


@dataclass(frozen=True)
class DraftTree:
    """An immutable draft tree, ready for one verification pass.

    tokens, parents, depths, source_ids: int64 [n]; on_spine: bool [n]. parents[0] == -1,
    source_ids[0] == -1 (the anchor belongs to no source). ``source_names[source_ids[i]]`` is the
    source that drafted node i.
    """

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    source_ids: np.ndarray
    on_spine: np.ndarray
    source_names: tuple[str, ...]
    max_depth: int
    _ancestors: list[np.ndarray] = field(default_factory=list, repr=False, compare=False)

    @property
    def size(self) -> int:
        """Number of nodes, the anchor included: the tree's row count in the verify pass."""
        return int(self.tokens.shape[0])

    @property
    def draft_size(self) -> int:
        return self.size - 1

    @property
    def ancestors(self) -> np.ndarray:
        """bool [n, n]: ancestors[i, j] is True when j is i or one of i's ancestors (computed once)."""
        if not self._ancestors:
            self._ancestors.append(ancestor_matrix(self.parents, self.max_depth))
        return self._ancestors[0]

    def root_path(self, node: int) -> np.ndarray:
        """Node indices from the first draft node down to ``node`` (anchor excluded), in depth order."""
        members = np.flatnonzero(self.ancestors[node])
        return members[members != ROOT]

    def previous_tokens(self, anchor_previous: int) -> np.ndarray:
        """The token before every node on its root path: what a bigram key of each row starts with."""
        return tokens_before(self.parents, self.tokens, np.arange(self.size), anchor_previous)

    def keeping(self, keep: np.ndarray) -> DraftTree:
        """The tree of the nodes where ``keep`` (bool [n]) is True, in their order; ``keep`` must hold the anchor
        and every kept node's parent (a node cut takes its subtree with it)."""
        depths = self.depths[keep]
        return DraftTree(
            tokens=self.tokens[keep], parents=kept_parents(self.parents, keep), depths=depths,
            source_ids=self.source_ids[keep], on_spine=self.on_spine[keep],
            source_names=self.source_names, max_depth=int(depths.max()),
        )

    @staticmethod
    def single(anchor: int, source_names: tuple[str, ...] = ()) -> DraftTree:
        """The one-node tree: plain autoregressive decoding through the same plumbing."""
        return TreeBuilder(anchor, source_names, capacity=0).build()


class TreeBuilder:
    """Lays nodes into a draft tree within a node budget, deduplicated on (parent, token).

    Planners call ``add_chain`` and ``add_children`` in priority order (most trusted source
    first); nodes beyond the budget are dropped and reported as -1.
    """

    def __init__(self, anchor: int, source_names: tuple[str, ...], capacity: int) -> None:
        self.source_names = tuple(source_names)
        self.capacity = capacity
        size = capacity + 1
        self._tokens = np.empty(size, dtype=np.int64)
        self._parents = np.empty(size, dtype=np.int64)
        self._depths = np.empty(size, dtype=np.int64)
        self._sources = np.empty(size, dtype=np.int64)
        self._spine = np.zeros(size, dtype=np.bool_)
        self._tokens[0], self._parents[0], self._depths[0], self._sources[0] = anchor, NO_PARENT, 0, NO_SOURCE
        self._size = 1
        self._max_depth = 0

    @property
    def size(self) -> int:
        return self._size

    @property
    def room(self) -> int:
        """Draft nodes that still fit in the budget."""
        return self.capacity + 1 - self._size

    @property
    def tokens(self) -> np.ndarray:
        return self._tokens[: self._size]

    @property
    def depths(self) -> np.ndarray:
        return self._depths[: self._size]

    @property
    def parents(self) -> np.ndarray:
        return self._parents[: self._size]

    def source_id(self, name: str) -> int:
        return self.source_names.index(name)

    def previous_tokens(self, nodes: np.ndarray, anchor_previous: int) -> np.ndarray:
        """The token before each of ``nodes`` on its root path."""
        return tokens_before(self.parents, self.tokens, nodes, anchor_previous)

    def _find(self, parents: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Index of the existing node with each (parent, token), or -1."""
        n = self._size
        same = (self._parents[None, :n] == parents[:, None]) & (self._tokens[None, :n] == tokens[:, None])
        return np.where(same.any(axis=1), same.argmax(axis=1), -1)

    def add_children(self, parents: np.ndarray, tokens: np.ndarray, source: int, spine: bool = False) -> np.ndarray:
        """Add one child per (parent, token) pair, in the given order; returns their node indices.

        Existing (parent, token) nodes are reused (their tag is kept). Pairs repeated within the
        call collapse to their first occurrence. Pairs past the budget get -1.
        """
        parents, tokens = _int64(parents), _int64(tokens)
        if parents.shape[0] == 0:
            return parents
        result = self._find(parents, tokens)
        # within-call duplicates: only the first of equal (parent, token) pairs is new
        same = (parents[None, :] == parents[:, None]) & (tokens[None, :] == tokens[:, None])
        first = same.argmax(axis=1)
        fresh = (result < 0) & (first == np.arange(parents.shape[0]))
        new_positions = np.flatnonzero(fresh)[: self.room]
        count = new_positions.shape[0]
        if count:
            start, stop = self._size, self._size + count
            new_parents = parents[new_positions]
            new_depths = self._depths[new_parents] + 1
            self._tokens[start:stop] = tokens[new_positions]
            self._parents[start:stop] = new_parents
            self._depths[start:stop] = new_depths
            self._sources[start:stop] = source
            self._spine[start:stop] = spine
            self._size = stop
            self._max_depth = max(self._max_depth, int(new_depths.max()))
            result[new_positions] = np.arange(start, stop)
        # duplicates inside the call point at their first occurrence's node (or -1 if it did not fit)
        return np.where(result < 0, result[first], result)

    def add_chain(self, parent: int, tokens: np.ndarray, source: int, spine: bool = False) -> np.ndarray:
        """Add a linear continuation under ``parent``; returns the node index of every token laid.

        A leading stretch that already exists in the tree is followed, not duplicated; the rest is
        appended in one block. The result is shorter than ``tokens`` when the budget runs out.
        """
        tokens = _int64(tokens)
        followed: list[int] = []
        position = 0
        while position < tokens.shape[0]:  # follow the existing prefix (rarely more than a step)
            node = int(self._find(np.array([parent]), tokens[position : position + 1])[0])
            if node < 0:
                break
            followed.append(node)
            parent, position = node, position + 1
        count = min(tokens.shape[0] - position, self.room)
        laid = np.arange(self._size, self._size + max(count, 0))
        if count > 0:
            start, stop = self._size, self._size + count
            self._tokens[start:stop] = tokens[position : position + count]
            self._parents[start] = parent
            self._parents[start + 1 : stop] = laid[:-1]
            base_depth = int(self._depths[parent])
            self._depths[start:stop] = np.arange(base_depth + 1, base_depth + 1 + count)
            self._sources[start:stop] = source
            self._spine[start:stop] = spine
            self._size = stop
            self._max_depth = max(self._max_depth, base_depth + count)
        return np.concatenate([np.array(followed, dtype=np.int64), laid])

    def build(self) -> DraftTree:
        n = self._size
        return DraftTree(
            tokens=self._tokens[:n].copy(),
            parents=self._parents[:n].copy(),
            depths=self._depths[:n].copy(),
            source_ids=self._sources[:n].copy(),
            on_spine=self._spine[:n].copy(),
            source_names=self.source_names,
            max_depth=self._max_depth,
        )


def _int64(values: np.ndarray | list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def checked_tree(tree: object, anchor: int, budget: int, vocab_size: int) -> DraftTree:
    """``tree`` if it is a well-formed draft tree rooted at ``anchor`` within ``budget``; CandidateError otherwise."""
    if not isinstance(tree, DraftTree):
        raise CandidateError(f"planner returned {type(tree).__name__}, not a DraftTree")
    n = tree.size
    if n > budget + 1 or int(tree.tokens[0]) != anchor or int(tree.parents[0]) != -1:
        raise CandidateError("tree exceeds its budget or is not rooted at the anchor")
    if any(array.shape != (n,) for array in (tree.parents, tree.depths, tree.source_ids, tree.on_spine)):
        raise CandidateError("tree arrays disagree in length")
    if n > 1:
        parents = tree.parents[1:]
        if not ((parents >= 0) & (parents < np.arange(1, n))).all():
            raise CandidateError("tree parents must precede their children")
        if int(tree.tokens.min()) < 0 or int(tree.tokens.max()) >= vocab_size:
            raise CandidateError("tree token ids outside the vocabulary")
        if np.unique(tree.parents * vocab_size + tree.tokens).shape[0] != n:
            raise CandidateError("tree has duplicate (parent, token) nodes")
        if not (tree.depths[1:] == tree.depths[parents] + 1).all():
            raise CandidateError("tree depths disagree with its parents")
        if int(tree.depths.max()) > tree.max_depth:
            raise CandidateError("tree is deeper than its max_depth")
    return tree


__all__ = ["ROOT", "CandidateError", "DraftTree", "TreeBuilder"]
