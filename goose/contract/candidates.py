"""What sources hand to planners: drafts, branch successors and acceptance estimates, all NumPy.

Sources and topologies never import each other. A source turns the context into a ``Draft`` (a
small trie hanging off the anchor) and/or answers successor queries ("what may follow the pair
(previous, token)?"); a topology turns the ``CandidatePool`` of all sources into a ``DraftTree``.
The pool is the only place they meet. Everything here is host-side NumPy: planning works on a few
dozen numbers per cycle, and the tree crosses to the model's device once, in the verifier.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from goose.contract.acceptance import clamp_probabilities
from goose.contract.tree import CandidateError, TreeBuilder, ancestor_matrix, kept_parents

# (previous tokens int64 [m], tokens int64 [m], k) -> (successors int64 [m, k'] (-1 = none), scores float [m, k'])
SuccessorFn = Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]]


def common_prefix(first: Sequence[int] | np.ndarray, second: Sequence[int] | np.ndarray) -> int:
    """Length of the common leading run of two token sequences."""
    first, second = np.asarray(first), np.asarray(second)
    length = min(first.shape[0], second.shape[0])
    differs = np.flatnonzero(first[:length] != second[:length])
    return int(differs[0]) if differs.shape[0] else length


def without_trailing_repeats(values: Sequence[float]) -> tuple[float, ...]:
    """A per-depth sequence in its shortest form: its last value repeats, so trailing copies of it say nothing."""
    values = list(values)
    end = len(values)
    while end > 1 and values[end - 2] == values[end - 1]:
        end -= 1
    return tuple(values[:end])


def token_ids(values: Sequence[int] | np.ndarray, what: str = "draft tokens") -> np.ndarray:
    """``values`` as int64 token ids (flattened); CandidateError for anything else: floats (``[1.5, 2.7]`` would
    otherwise become ``[1, 2]``), bools, strings, None. Any integer dtype, NumPy's included, is fine."""
    array = np.asarray(values)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)  # np.asarray([]) is float64
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise CandidateError(f"{what} must be integer token ids, got {array.dtype} {_shown(array)}")
    if isinstance(values, list | tuple) and any(isinstance(v, bool | np.bool_) for v in values):  # [5, True]: int64
        raise CandidateError(f"{what} must be integer token ids, got a bool in {_shown(np.asarray(values, object))}")
    return array.astype(np.int64, copy=False).reshape(-1)


def _shown(array: np.ndarray, most: int = 4) -> str:
    """The first few values of ``array``, for an error message."""
    values = array.reshape(-1)
    return str(values[:most].tolist())[:-1] + (", ...]" if values.shape[0] > most else "]")


def eos_token_ids(*holders: Any) -> frozenset[int]:
    """The end-of-sequence ids the ``eos_token_id`` of each holder names (a generation config, a tokenizer): an
    int, a list of them, or nothing."""
    found: set[int] = set()
    for value in (getattr(holder, "eos_token_id", None) for holder in holders):
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, list | tuple):
            found.update(int(v) for v in value)
    return frozenset(found)


@dataclass(frozen=True)
class DecodeContext:
    """What a source sees when asked to draft: the token context, anchor last.

    ``tokens`` is a read-only int64 view into the decoder's buffer; copy what you keep past the call.
    ``tokenizer`` is the target's tokenizer (None when the caller has none), for sources that work
    with text (datastores, phrase lists). ``prediction`` is the request's predicted output (OpenAI's
    Predicted Outputs) as read-only int64 token ids, or None; the same array every cycle of a request.
    """

    tokens: np.ndarray
    prompt_length: int
    vocab_size: int
    eos_token_ids: frozenset[int]
    tokenizer: Any = None
    prediction: np.ndarray | None = None

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
    otherwise; scores float [m] in [0, 1]: the chance that token i is accepted given that its
    parent was (None: the source's acceptance estimate for every token, filled in by the decoder).
    ``consensus`` counts leading chain tokens that several independent matches agree on (planners
    may extend or bypass on it). ``depth_acceptance`` optionally says how far this very draft is
    trusted per depth (entry i: token i + 1 accepted given its parent was; the last entry repeats);
    the pool then ranks the source by its chain-equivalent rate (:func:`chain_rate`) instead of the
    decoder's estimate, and the automatic budget sizes the spine by it.
    """

    tokens: np.ndarray
    parents: np.ndarray
    scores: np.ndarray | None = None
    consensus: int = 0
    depth_acceptance: tuple[float, ...] = field(default=())

    @classmethod
    def chain(cls, tokens: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray | float | None = None,
              consensus: int = 0, depth_acceptance: Sequence[float] = ()) -> Draft:
        """A linear draft: token i + 1 hangs off token i. ``scores``: one number, one per token, or None.
        Tokens must be integers (CandidateError otherwise: a float is never rounded to an id)."""
        tokens = token_ids(tokens)
        if scores is not None:
            scores = np.broadcast_to(np.asarray(scores, dtype=np.float64), tokens.shape).copy()
        return cls(tokens, np.arange(-1, tokens.shape[0] - 1, dtype=np.int64), scores, consensus,
                   tuple(depth_acceptance))

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
        return cls(token_ids(tokens), parent, acceptance * weight / parent_weight)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @cached_property
    def is_chain(self) -> bool:
        """Whether every token hangs off the one before it (a linear draft)."""
        return bool((self.parents == np.arange(-1, len(self) - 1)).all())

    @cached_property
    def ancestors(self) -> np.ndarray:
        """bool [m, m]: row i marks node i and its ancestors among the draft's nodes (the anchor left out)."""
        return ancestor_matrix(np.concatenate([[-1], self.parents + 1]), len(self))[1:, 1:]

    @cached_property
    def best_path(self) -> tuple[np.ndarray, np.ndarray]:
        """Tokens [L] and path scores [L] of the most valuable root path, in depth order (computed once).

        A node's path score is the product of the scores on its root path: the chance the target
        accepts the whole path. For a chain the path is the whole chain; for a trie it is the root
        path whose nodes' path scores sum highest (the path with the most expected accepted tokens),
        so a long agreeing branch beats a short confident one only when it is worth more tokens.
        Needs scores (the decoder fills them in before planners see the draft).
        """
        scores = np.clip(np.asarray(self.scores, dtype=np.float64), 0.0, 1.0)
        if self.is_chain:
            return self.tokens, np.cumprod(scores)
        ancestors = self.ancestors.astype(np.float64)
        path_scores = np.exp(ancestors @ np.log(np.maximum(scores, 1e-12)))
        path_value = ancestors @ path_scores  # expected accepted tokens along the path to each node
        members = np.flatnonzero(ancestors[int(path_value.argmax())])  # parents precede children
        return self.tokens[members], path_scores[members]

    def within_depth(self, depth: int) -> Draft:
        """This draft without its nodes deeper than ``depth`` (a child of the anchor is at depth 1).

        A request that may keep only ``depth`` more tokens cannot use a deeper draft token, and a
        planner that saw one would buy rows for it: a trusted copy running past ``max_new_tokens``
        would otherwise be verified a hundred rows deep for the last few tokens.
        """
        if len(self) <= depth:
            return self
        # a node's depth is the count of its ancestors-or-self; a chain's are its positions
        keep = np.arange(len(self)) < depth if self.is_chain else self.ancestors.sum(axis=1) <= depth
        scores = None if self.scores is None else np.asarray(self.scores)[keep]
        return Draft(self.tokens[keep], kept_parents(self.parents, keep), scores, min(self.consensus, depth),
                     self.depth_acceptance)  # a kept node's parent, shallower, is kept too

    def validated(self, vocab_size: int, default_score: float) -> Draft:
        """This draft as clean arrays (scores filled with ``default_score`` when None); CandidateError if malformed."""
        try:
            tokens = np.asarray(self.tokens)
            parents = np.asarray(self.parents)
            scores = np.full(tokens.shape, default_score) if self.scores is None else np.asarray(self.scores)
            scores = scores.astype(np.float64, copy=False)
        except (TypeError, ValueError) as error:
            raise CandidateError(f"draft fields are not arrays: {error}") from None
        for values, what in ((tokens, "draft tokens"), (parents, "draft parents")):  # floats are never rounded
            if values.dtype == np.bool_ or not np.issubdtype(values.dtype, np.integer):
                raise CandidateError(f"{what} must be an integer array, got {values.dtype} {_shown(values)}")
        m = tokens.shape[0] if tokens.ndim == 1 else -1
        if m < 0 or parents.shape != (m,) or scores.shape != (m,):
            raise CandidateError(f"draft shapes disagree: tokens {tokens.shape}, parents {parents.shape}, "
                                 f"scores {scores.shape}")
        if m and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
            raise CandidateError(f"draft token ids outside the vocabulary [0, {vocab_size})")
        if m and not ((parents < np.arange(m)) & (parents >= -1)).all():
            raise CandidateError("draft parents must satisfy -1 <= parents[i] < i")
        if m and not np.isfinite(scores).all():
            raise CandidateError("draft scores must be finite")
        if not isinstance(self.consensus, int | np.integer):
            raise CandidateError(f"draft consensus must be an int, got {type(self.consensus).__name__}")
        try:
            depths = np.asarray(self.depth_acceptance, dtype=np.float64)
        except (TypeError, ValueError):
            depths = np.zeros((0, 0))
        if depths.ndim != 1:
            raise CandidateError("draft depth_acceptance must be a sequence of probabilities")
        return Draft(tokens.astype(np.int64, copy=False), parents.astype(np.int64, copy=False),
                     np.clip(scores, 0.0, 1.0), max(0, int(self.consensus)),
                     tuple(clamp_probabilities(depths).tolist()))


@dataclass(frozen=True)
class SourceCandidates:
    """One source's contribution to a cycle."""

    name: str
    source_id: int
    acceptance: float  # one rate: the chain-equivalent rate of ``depth_acceptance`` over the draft
    draft: Draft | None
    successors: SuccessorFn | None
    depth_acceptance: tuple[float, ...] = ()  # per draft depth (the last repeats); () = ``acceptance`` at every depth

    @property
    def spine_acceptance(self) -> float | tuple[float, ...]:
        """What planners size this source's spine by: its per-depth estimates if the draft gave them, else the rate."""
        return self.depth_acceptance or self.acceptance


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

    ``source_names`` is the decoder's fixed list of source names; ``source_id`` in each entry
    indexes it and is what the planner tags tree nodes with.
    """

    anchor: int
    previous: int
    source_names: tuple[str, ...]
    candidates: tuple[SourceCandidates, ...]

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


def checked_successors(answer: object, m: int, k: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A successor answer as exactly int64 [m, k] and scores in [0, 1] (-1 / 0 where nothing is known, and for
    None); CandidateError when malformed."""
    tokens, scores = np.full((m, k), -1, dtype=np.int64), np.zeros((m, k))
    if answer is None:
        return tokens, scores
    try:
        found, found_scores = (np.asarray(part) for part in answer)  # type: ignore[union-attr]
    except (TypeError, ValueError) as error:
        raise CandidateError(f"successors must be (tokens, scores): {error}") from None
    if found.ndim != 2 or found.shape[0] != m or found_scores.shape != found.shape:
        raise CandidateError(f"successor shapes {found.shape} / {found_scores.shape} do not fit {m} queries")
    if found.size and not np.issubdtype(found.dtype, np.integer):
        raise CandidateError(f"successor tokens must be integer token ids, got {found.dtype} {_shown(found)}")
    if found.size and (int(found.max()) >= vocab_size or int(found.min()) < -1):
        raise CandidateError(f"successor token ids outside the vocabulary [0, {vocab_size})")
    width = min(k, found.shape[1])
    tokens[:, :width] = found[:, :width]
    try:
        raw = found_scores[:, :width].astype(np.float64)
    except (TypeError, ValueError) as error:
        raise CandidateError(f"successor scores must be numbers: {error}") from None
    usable = (tokens[:, :width] >= 0) & np.isfinite(raw) & (raw > 0.0)
    scores[:, :width] = np.where(usable, np.minimum(raw, 1.0), 0.0)
    return tokens, scores


__all__ = ["CandidatePool", "DecodeContext", "Draft", "SourceCandidates", "SuccessorFn", "chain_rate", "common_prefix",
           "eos_token_ids", "token_ids", "without_trailing_repeats"]
