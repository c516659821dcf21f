"""Unified greedy walk: the longest draft path the target agrees with, then the bonus token.

A draft node is correct when its token equals the target's argmax at its parent. Because the
tree is unique on (parent, token), at most one child of any node is correct, so the accepted
nodes (correct all the way up) form a single path, found with tensor ops and no per-node loop.
Where two sources proposed the same token under the same parent, the node carries the tag of
the one the planner laid first (the most trusted), which is the paper's "prefer context match
over transition" rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from goose.outcome import PathKind
from goose.tree import ROOT, DraftTree


@dataclass(frozen=True)
class Walk:
    """The walk's result. ``path``: accepted draft nodes in depth order; ``tokens``: their tokens then the bonus."""

    path: torch.Tensor
    tokens: list[int]
    bonus_token: int
    reached: torch.Tensor
    accepted: torch.Tensor
    kind: PathKind


def walk(tree: DraftTree, predictions: torch.Tensor) -> Walk:
    """Walk ``tree`` given the target's argmax ``predictions`` [n] at every node."""
    predictions = predictions.to("cpu")
    correct = tree.tokens == predictions[tree.parents.clamp(min=0)]
    correct[ROOT] = True
    # accepted: the node and all its ancestors are correct
    accepted = ~(tree.ancestors & ~correct[None, :]).any(dim=1)
    deepest = int(torch.argmax(torch.where(accepted, tree.depths, -1)))
    path = tree.root_path(deepest)
    reached = accepted[tree.parents.clamp(min=0)]
    reached[ROOT] = False
    bonus = int(predictions[deepest])
    return Walk(
        path=path,
        tokens=[*tree.tokens[path].tolist(), bonus],
        bonus_token=bonus,
        reached=reached,
        accepted=accepted & (tree.depths > 0),
        kind=classify(tree, path),
    )


def classify(tree: DraftTree, path: torch.Tensor) -> PathKind:
    """Pure spine, pure branch, spine continuation, or bonus only."""
    if path.numel() == 0:
        return PathKind.BONUS
    spine = tree.on_spine[path]
    if not bool(spine[0]):
        return PathKind.BRANCH
    return PathKind.SPINE if bool(spine.all()) else PathKind.CONTINUATION
