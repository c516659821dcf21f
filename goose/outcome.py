"""What one verification pass tells the sources: the accepted path and the target's top-k."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch

from goose.tree import DraftTree


class PathKind(str, Enum):
    """How the accepted path used the tree (the paper's path taxonomy)."""

    SPINE = "pure_spine"  # only spine nodes accepted
    BRANCH = "pure_branch"  # the path starts on a branch off the root
    CONTINUATION = "spine_continuation"  # spine first, then a branch after the spine broke
    BONUS = "bonus_only"  # no draft token accepted; the bonus token alone


@dataclass(frozen=True)
class Harvest:
    """Top-k of the target's logits at verified positions, with the two tokens that led there.

    For position j: ``previous[j]``, ``tokens[j]`` are the last two tokens of its root path
    (previous is -1 when unknown) and ``top_tokens[j]`` / ``top_scores[j]`` the target's k most
    likely next tokens (scores: softmax over the k kept logits). Every verified row is here,
    rejected branches included; at prefill, the last prompt positions.
    """

    previous: torch.Tensor
    tokens: torch.Tensor
    top_tokens: torch.Tensor
    top_scores: torch.Tensor

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


@dataclass(frozen=True)
class AuxiliaryRows:
    """Rows a source rides along in the verification pass without drafting them (e.g. Jacobi windows).

    tokens int64 [a]; position_offsets int64 [a]: positions relative to the anchor's (the anchor
    is at offset 0, its first successor at 1); mask bool [a, a]: which auxiliary rows each row
    may attend to (itself included). Every row also sees the cached context and the anchor, and
    no draft node sees them. Their key/values are discarded after the pass.
    """

    tokens: torch.Tensor
    position_offsets: torch.Tensor
    mask: torch.Tensor

    def validate(self, vocab_size: int) -> AuxiliaryRows:
        a = self.tokens.shape[0]
        if self.tokens.ndim != 1 or self.position_offsets.shape != (a,) or self.mask.shape != (a, a):
            raise ValueError("auxiliary rows: tokens [a], position_offsets [a] and mask [a, a] disagree")
        if a and (int(self.tokens.min()) < 0 or int(self.tokens.max()) >= vocab_size):
            raise ValueError(f"auxiliary token ids outside the vocabulary [0, {vocab_size})")
        if a and int(self.position_offsets.min()) < 1:
            raise ValueError("auxiliary rows must sit after the anchor (position_offsets >= 1)")
        return self


@dataclass(frozen=True)
class VerifyOutcome:
    """The result of one Goose cycle, as every source observes it.

    ``accepted_nodes``: draft-node indices of the accepted path in depth order (anchor
    excluded). ``new_tokens``: what the cycle appended to the output (accepted draft tokens,
    then the bonus token), already cut at EOS and at the generation limit. ``reached`` /
    ``accepted``: bool [n] per tree node: whether the node was tested (its parent accepted) and
    whether it was accepted. ``auxiliary``: per source, the target's logits [a, V] at the rows it
    added through ``goose_auxiliary_rows``; ``auxiliary_predictions``: their argmax [a] on the host,
    from the one argmax (and device sync) the decoder already does for the walk.
    """

    tree: DraftTree
    accepted_nodes: torch.Tensor
    new_tokens: list[int]
    bonus_token: int
    reached: torch.Tensor
    accepted: torch.Tensor
    path_kind: PathKind
    harvest: Harvest
    auxiliary: dict[str, torch.Tensor] = field(default_factory=dict)
    auxiliary_predictions: dict[str, torch.Tensor] = field(default_factory=dict)

    def updated_acceptance(self, source: str, current: float, rate: float) -> float:
        """``current`` moved by EMA ``rate`` towards this cycle's accepted / tested ratio of ``source``'s nodes.

        Unchanged when none of the source's nodes was tested (such a cycle says nothing about it).
        """
        if source not in self.tree.source_names:
            return current
        reached, accepted = self.source_counts(self.tree.source_names.index(source))
        return current + rate * (accepted / reached - current) if reached else current

    def source_counts(self, source_id: int) -> tuple[int, int]:
        """(reached, accepted) draft nodes of one source in this cycle."""
        mine = self.tree.source_ids == source_id
        return int((mine & self.reached).sum()), int((mine & self.accepted).sum())
