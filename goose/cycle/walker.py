"""The walk: the longest draft path the target agrees with, then the bonus token.

Greedy: a draft node is correct when its token equals the target's argmax at its parent. Because
the tree is unique on (parent, token), at most one child of any node is correct, so the accepted
nodes (correct all the way up) form a single path, found with array ops and no per-node loop.

Sampled: the target's token at a row is drawn from that row's (warped) distribution, and the walk
is ancestral sampling whose rows the tree has precomputed: draw at the anchor's row; if a child
carries the drawn token, move there and draw from its row; the first drawn token with no such child
is the bonus token. Only the rows on the walked path are drawn from. The output follows the
target's distribution whatever was drafted (recursive rejection sampling with deterministic drafts).

Where two sources proposed the same token under the same parent, the node carries the tag of the
one the planner laid first (the most trusted): the paper's "prefer context match over transition".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from goose.contract.outcome import Harvest, PathKind, VerifyOutcome
from goose.contract.tree import ROOT, DraftTree


@dataclass(frozen=True)
class Walk:
    """The walk of ``tree``. ``path``: accepted draft nodes in depth order; ``tokens``: their tokens then the bonus.

    ``reached``: bool [n], nodes that were tested (their parent was accepted); ``accepted``: bool [n].
    """

    tree: DraftTree
    path: np.ndarray
    tokens: list[int]
    bonus_token: int
    reached: np.ndarray
    accepted: np.ndarray
    kind: PathKind

    def outcome(self, new_tokens: list[int], harvest: Harvest) -> VerifyOutcome:
        """What the sources observe of this walk: ``new_tokens`` what the cycle appended (the walked tokens, cut
        at EOS and at the generation limit), ``harvest`` the target's top-k at the tree's rows."""
        return VerifyOutcome(tree=self.tree, accepted_nodes=self.path, new_tokens=new_tokens,
                             bonus_token=self.bonus_token, reached=self.reached, accepted=self.accepted,
                             path_kind=self.kind, harvest=harvest)


def walk(tree: DraftTree, predictions: np.ndarray) -> Walk:
    """Greedy walk of ``tree`` given the target's argmax ``predictions`` [n] at every node."""
    correct = tree.tokens == predictions[np.maximum(tree.parents, 0)]
    correct[ROOT] = True
    accepted = ~(tree.ancestors & ~correct[None, :]).any(axis=1)  # the node and all its ancestors are correct
    deepest = int(np.argmax(np.where(accepted, tree.depths, -1)))
    return _result(tree, tree.root_path(deepest), int(predictions[deepest]))


def walk_sampled(tree: DraftTree, draw: Callable[[int], int]) -> Walk:
    """Sampled walk of ``tree``; ``draw(node)`` is the target's token drawn at ``node``'s row."""
    node, path = ROOT, []
    while True:
        token = draw(node)
        child = np.flatnonzero((tree.parents == node) & (tree.tokens == token))
        if child.shape[0] == 0:
            return _result(tree, np.asarray(path, dtype=np.int64), token)
        node = int(child[0])
        path.append(node)


def _result(tree: DraftTree, path: np.ndarray, bonus: int) -> Walk:
    on_path = np.zeros(tree.size, dtype=np.bool_)
    on_path[ROOT] = True
    on_path[path] = True
    reached = on_path[np.maximum(tree.parents, 0)]
    reached[ROOT] = False
    return Walk(tree=tree, path=path, tokens=[*tree.tokens[path].tolist(), bonus], bonus_token=bonus, reached=reached,
                accepted=on_path & (tree.depths > 0), kind=classify(tree, path))


def classify(tree: DraftTree, path: np.ndarray) -> PathKind:
    """Pure spine, pure branch, spine continuation, or bonus only."""
    if path.shape[0] == 0:
        return PathKind.BONUS
    spine = tree.on_spine[path]
    if not bool(spine[0]):
        return PathKind.BRANCH
    return PathKind.SPINE if bool(spine.all()) else PathKind.CONTINUATION


__all__ = ["Walk", "walk", "walk_sampled"]
