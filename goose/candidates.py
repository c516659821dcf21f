"""What sources hand to planners: drafts, branch successors and acceptance estimates.

Sources and topologies never import each other. A source turns the context into a ``Draft``
(a small trie hanging off the anchor) and/or answers successor queries ("what may follow the
pair (previous, token)?"); a topology turns the ``CandidatePool`` of all sources into a
``DraftTree``. The pool is the only place they meet.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from goose.config import GooseConfig
from goose.tree import TreeBuilder, ancestor_matrix

# (previous tokens [m], tokens [m], k) -> (successor tokens [m, k] (-1 = none), scores [m, k])
SuccessorFn = Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


class CandidateError(ValueError):
    """A source returned a malformed draft or successor table."""


def before_eos(tokens: list[int] | tuple[int, ...], eos: frozenset[int]) -> list[int] | tuple[int, ...]:
    """``tokens`` up to (not including) the first EOS: a draft past an EOS can never be accepted
    beyond it, and drafting the EOS itself gains nothing (if all before it is accepted, the bonus
    token is that EOS for free)."""
    if eos.isdisjoint(tokens):  # the common case, decided in C
        return tokens
    for position, token in enumerate(tokens):
        if token in eos:
            return tokens[:position]
    return tokens


@dataclass(frozen=True)
class DecodeContext:
    """What a source sees when asked to draft: the token context, anchor last.

    ``tokens`` is a read-only view into the decoder's buffer; copy what you keep past the call.
    """

    tokens: np.ndarray
    prompt_length: int
    vocab_size: int
    eos_token_ids: frozenset[int]
    config: GooseConfig
    tokenizer: Any = None  # the target's tokenizer, for sources that work with text (datastores, phrases)

    @property
    def anchor(self) -> int:
        return int(self.tokens[-1])

    @property
    def previous(self) -> int:
        """The token before the anchor, -1 for a one-token context."""
        return int(self.tokens[-2]) if self.tokens.shape[0] > 1 else -1


@dataclass(frozen=True)
class Draft:
    """A source's proposal: draft tokens in a trie rooted at the anchor.

    tokens int64 [m]; parents int64 [m] with -1 for a child of the anchor and parents[i] < i
    otherwise; scores float32 [m] in [0, 1]: the source's estimate that token i is accepted
    given that its parent was. ``consensus`` counts leading chain tokens that several
    independent matches agree on (context match uses it; planners may extend or bypass on it).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    scores: torch.Tensor
    consensus: int = 0

    @classmethod
    def chain(cls, tokens: torch.Tensor | list[int], scores: torch.Tensor | list[float] | float,
              consensus: int = 0) -> Draft:
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        m = tokens.shape[0]
        scores = torch.as_tensor(scores, dtype=torch.float32)
        if scores.ndim == 0:
            scores = scores.expand(m).clone()
        return cls(tokens=tokens, parents=torch.arange(-1, m - 1), scores=scores, consensus=consensus)

    @classmethod
    def trie(cls, paths: Sequence[Sequence[int]], weights: Sequence[float], acceptance: float) -> Draft | None:
        """Merge weighted token paths (best first) into one trie; shared prefixes become one node.

        A node's score is ``acceptance`` times the share of its parent's weight that passes
        through it (the anchor's weight is that of all its children): the source's per-token
        estimate, split among siblings by how much evidence each has. Paths are short and few
        (a source's handful of matches), so a dict keyed by (parent, token) dedupes them.
        """
        nodes: dict[tuple[int, int], int] = {}
        tokens: list[int] = []
        parents: list[int] = []
        node_weights: list[float] = []
        for path, weight in zip(paths, weights, strict=True):
            parent = -1
            for token in path:
                node = nodes.get((parent, token))
                if node is None:
                    node = nodes[(parent, token)] = len(tokens)
                    tokens.append(token)
                    parents.append(parent)
                    node_weights.append(0.0)
                node_weights[node] += weight
                parent = node
        if not tokens:
            return None
        weight = np.asarray(node_weights)
        parent = np.asarray(parents, dtype=np.int64)
        parent_weight = np.where(parent >= 0, weight[np.maximum(parent, 0)], weight[parent < 0].sum())
        return cls(tokens=torch.tensor(tokens, dtype=torch.long), parents=torch.from_numpy(parent),
                   scores=torch.from_numpy((acceptance * weight / parent_weight).astype(np.float32)))

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def is_chain(self) -> bool:
        return bool((self.parents == torch.arange(-1, len(self) - 1)).all())

    def path_scores(self) -> torch.Tensor:
        """Estimated probability that each node's whole root path is accepted (cumulative product)."""
        if self.is_chain:
            return torch.cumprod(self.scores, dim=0)
        # log-space sum over ancestors: the same pointer jumping the tree's mask uses
        parents = torch.cat([torch.tensor([-1]), self.parents + 1])
        depth = len(self)  # an upper bound on the trie's depth
        ancestors = ancestor_matrix(parents, depth)[1:, 1:].float()
        return torch.exp(ancestors @ torch.log(self.scores.clamp(min=1e-12)))

    def validate(self, vocab_size: int) -> Draft:
        """Raise CandidateError unless the draft is well formed for a vocabulary of ``vocab_size``."""
        if not all(isinstance(t, torch.Tensor) for t in (self.tokens, self.parents, self.scores)):
            raise CandidateError("draft fields must be tensors")
        m = self.tokens.shape[0]
        if self.tokens.ndim != 1 or self.parents.shape != (m,) or self.scores.shape != (m,):
            raise CandidateError(f"draft shapes disagree: tokens {tuple(self.tokens.shape)}, "
                                 f"parents {tuple(self.parents.shape)}, scores {tuple(self.scores.shape)}")
        if m and (int(self.tokens.min()) < 0 or int(self.tokens.max()) >= vocab_size):
            raise CandidateError(f"draft token ids outside the vocabulary [0, {vocab_size})")
        if m and not bool((self.parents < torch.arange(m)).all() and (self.parents >= -1).all()):
            raise CandidateError("draft parents must satisfy -1 <= parents[i] < i")
        if m and not bool(torch.isfinite(self.scores).all()):
            raise CandidateError("draft scores must be finite")
        return self


@dataclass(frozen=True)
class SourceCandidates:
    """One source's contribution to a cycle."""

    name: str
    source_id: int
    acceptance: float  # one rate: the chain-equivalent rate of ``depth_acceptance`` over the draft
    draft: Draft | None
    successors: SuccessorFn | None
    depth_acceptance: tuple[float, ...] = ()  # per draft depth (the last repeats); () = ``acceptance`` at every depth


def chain_rate(depth_acceptance: Sequence[float], length: int) -> float:
    """The one per-token rate of a chain of ``length`` tokens with per-depth acceptance (the last value repeats).

    Expected accepted over expected tested tokens, sum_{i=1..L} R_i / sum_{i=0..L-1} R_i with R_i
    the chance of reaching depth i: what an EMA of accepted / tested would measure on such chains.
    """
    if not depth_acceptance:
        return 0.0
    length = max(1, length)
    values = np.fromiter(depth_acceptance[:length], dtype=np.float64)
    if values.shape[0] < length:
        values = np.concatenate([values, np.full(length - values.shape[0], values[-1])])
    reach = np.cumprod(values)
    tested = 1.0 + float(reach[:-1].sum())
    return float(reach.sum()) / tested


@dataclass(frozen=True)
class CandidatePool:
    """All sources' candidates for one cycle, most trusted source first.

    ``source_names`` is the decoder's fixed list of source names; ``source_id`` in each
    entry indexes it and is what the planner tags tree nodes with.
    """

    anchor: int
    previous: int
    source_names: tuple[str, ...]
    candidates: tuple[SourceCandidates, ...]

    def get(self, name: str) -> SourceCandidates | None:
        return next((c for c in self.candidates if c.name == name), None)

    @property
    def drafting(self) -> tuple[SourceCandidates, ...]:
        """Sources with a non-empty draft this cycle, most trusted first."""
        return tuple(c for c in self.candidates if c.draft is not None and len(c.draft) > 0)

    @property
    def branching(self) -> tuple[SourceCandidates, ...]:
        """Sources that answer successor queries, most trusted first."""
        return tuple(c for c in self.candidates if c.successors is not None)

    def builder(self, budget: int) -> TreeBuilder:
        return TreeBuilder(self.anchor, self.source_names, capacity=budget)

    def successors_of(
        self, source: SourceCandidates, builder: TreeBuilder, nodes: torch.Tensor, k: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Ask ``source`` for up to k successors of each tree node: tokens [m, k] (-1 = none), scores."""
        if source.successors is None or nodes.numel() == 0:
            empty = torch.empty(nodes.shape[0], 0)
            return empty.long(), empty
        parents = builder.parents[nodes]
        previous = torch.where(parents >= 0, builder.tokens[parents.clamp(min=0)],
                               torch.full_like(parents, self.previous))
        return source.successors(previous, builder.tokens[nodes], k)
