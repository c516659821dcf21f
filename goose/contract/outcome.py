"""What one verification pass tells the sources: the accepted path and the target's top-k, in NumPy."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from goose.contract.tree import DraftTree


class PathKind(str, Enum):
    """How the accepted path used the tree (the paper's path taxonomy)."""

    SPINE = "pure_spine"  # only spine nodes accepted
    BRANCH = "pure_branch"  # the path starts on a branch off the root
    CONTINUATION = "spine_continuation"  # spine first, then a branch after the spine broke
    BONUS = "bonus_only"  # no draft token accepted; the bonus token alone


@dataclass(frozen=True)
class Harvest:
    """Top-k of the target's distribution at verified positions, with the two tokens that led there.

    For position j: ``previous[j]``, ``tokens[j]`` are the last two tokens of its root path
    (previous is -1 when unknown) and ``top_tokens[j]`` / ``top_scores[j]`` the target's k most
    likely next tokens (scores: softmax over the k kept logits). Every verified row is here,
    rejected branches included; at prefill, the last prompt positions.
    """

    previous: np.ndarray  # int64 [r]
    tokens: np.ndarray  # int64 [r]
    top_tokens: np.ndarray  # int64 [r, k]
    top_scores: np.ndarray  # float32 [r, k]

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @classmethod
    def empty(cls, k: int = 0) -> Harvest:
        nothing = np.zeros(0, dtype=np.int64)
        return cls(nothing, nothing, np.zeros((0, k), dtype=np.int64), np.zeros((0, k), dtype=np.float32))

    @classmethod
    def of_tree(cls, tree: DraftTree, anchor_previous: int, top_tokens: np.ndarray, top_scores: np.ndarray) -> Harvest:
        """The harvest of every tree row: each row is keyed by its node's token and the token before it."""
        return cls(tree.previous_tokens(anchor_previous), tree.tokens, top_tokens, top_scores)

    @classmethod
    def of_prompt(cls, prompt_ids: list[int], top_tokens: np.ndarray, top_scores: np.ndarray) -> Harvest:
        """The harvest of the last ``len(top_tokens)`` prompt positions before the last one.

        (The last prompt position's row predicts the first generated token, which is not a row a
        source can learn a transition from before that token is known.)
        """
        rows = top_tokens.shape[0]
        ids = np.asarray(prompt_ids, dtype=np.int64)
        end = ids.shape[0] - 1
        tokens = ids[end - rows : end]
        known = ids[max(0, end - rows - 1) : max(0, end - 1)]
        previous = np.concatenate([np.full(rows - known.shape[0], -1, dtype=np.int64), known])
        return cls(previous, tokens, top_tokens, top_scores)


@dataclass(frozen=True)
class AuxiliaryRows:
    """Rows a source rides along in the verification pass without drafting them (e.g. Jacobi windows).

    tokens int64 [a]; position_offsets int64 [a]: positions relative to the anchor's (the anchor
    is at offset 0, its first successor at 1); mask bool [a, a]: which auxiliary rows each row
    may attend to (itself included). Every row also sees the cached context and the anchor, and
    no draft node sees them. Their key/values are discarded after the pass.
    """

    tokens: np.ndarray
    position_offsets: np.ndarray
    mask: np.ndarray

    def validated(self, vocab_size: int) -> AuxiliaryRows:
        """These rows as clean arrays; ValueError when malformed."""
        tokens = np.asarray(self.tokens)
        offsets = np.asarray(self.position_offsets)
        mask = np.asarray(self.mask)
        a = tokens.shape[0] if tokens.ndim == 1 else -1
        if a < 0 or offsets.shape != (a,) or mask.shape != (a, a):
            raise ValueError("auxiliary rows: tokens [a], position_offsets [a] and mask [a, a] disagree")
        if not (np.issubdtype(tokens.dtype, np.integer) and np.issubdtype(offsets.dtype, np.integer)):
            raise ValueError("auxiliary rows: tokens and position_offsets must be integer arrays")
        if a and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
            raise ValueError(f"auxiliary token ids outside the vocabulary [0, {vocab_size})")
        if a and int(offsets.min()) < 1:
            raise ValueError("auxiliary rows must sit after the anchor (position_offsets >= 1)")
        return AuxiliaryRows(tokens.astype(np.int64, copy=False), offsets.astype(np.int64, copy=False),
                             mask.astype(np.bool_, copy=False))


@dataclass(frozen=True)
class VerifyOutcome:
    """The result of one Goose cycle, as every source observes it.

    ``accepted_nodes``: draft-node indices of the accepted path in depth order (anchor
    excluded). ``new_tokens``: what the cycle appended to the output (accepted draft tokens,
    then the bonus token), already cut at EOS and at the generation limit. ``reached`` /
    ``accepted``: bool [n] per tree node: whether the node was tested (its parent accepted) and
    whether it was accepted. ``harvest``: the target's top-k at every tree row.
    """

    tree: DraftTree
    accepted_nodes: np.ndarray
    new_tokens: list[int]
    bonus_token: int
    reached: np.ndarray
    accepted: np.ndarray
    path_kind: PathKind
    harvest: Harvest


__all__ = ["AuxiliaryRows", "Harvest", "PathKind", "VerifyOutcome"]
