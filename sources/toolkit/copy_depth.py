"""Acceptance by copy depth: how often a copy that has held for D tokens holds for one more.

Context match and the suffix memory both draft copies of earlier text and learn how far such a
copy goes on from its own tested tokens; the option validators their n-gram ladders and depth
bins share are here too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from goose.contract.outcome import VerifyOutcome


def longest_first(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """n-gram lengths (a non-empty list of lengths >= 1), longest first: the order matches are tried in."""
    if not sizes or min(sizes) < 1:
        raise ValueError("ngram_sizes must be a non-empty list of lengths >= 1")
    return tuple(sorted(set(sizes), reverse=True))


def increasing_edges(edges: tuple[int, ...]) -> tuple[int, ...]:
    """Match-depth bin edges: strictly increasing lengths >= 1 (empty: one bin)."""
    if list(edges) != sorted(set(edges)) or (edges and edges[0] < 1):
        raise ValueError("depth_edges must be strictly increasing lengths >= 1")
    return tuple(edges)


def probability_ladder(prior: float | tuple[float, ...]) -> float | tuple[float, ...]:
    """A depth prior option: one probability, or a non-empty ladder of them (one per depth bin)."""
    prior_ladder(prior, 1)  # raises on anything that is not probabilities
    return prior


def prior_ladder(prior: float | tuple[float, ...], bins: int) -> np.ndarray:
    """Per-bin prior acceptance: one value for every bin, or a ladder whose last value repeats."""
    values = np.atleast_1d(np.asarray(prior, dtype=np.float64))
    if values.size == 0 or not ((values >= 0.0) & (values <= 1.0)).all():
        raise ValueError(f"depth_prior must be probabilities in [0, 1], got {prior}")
    return np.concatenate([values, np.full(max(0, bins - values.size), values[-1])])[:bins]


class CopyDepthEstimate:
    """How often a copy that has held for D tokens holds for one more, per bin of D.

    A draft token's *copy depth* D is how many tokens the context shares with the copied
    occurrence when that token is due: the match depth for the draft's first token, one more for
    each draft token before it (those are accepted whenever this one is tested). Copies behave
    like a hazard process: a fresh 3-gram hit is often chance, a copy that has held for dozens of
    tokens (a function quoted back, a list re-typed) usually goes on. Every tested draft token is
    one observation of its bin, so the deep bins, where one long draft tests dozens of tokens,
    learn fast and stay steady; one EMA per whole draft could not tell 0.97 from 0.99 a token,
    which is where the best verified length of a long copy flips on a CPU cost curve.

    Per bin the estimate is (accepted + PRIOR_WEIGHT * prior) / (tested + PRIOR_WEIGHT) over
    counts that fade by ``1 - 1 / memory`` per new observation of that bin. ``prior`` is one value for
    every bin or one per bin (a shorter ladder's last value repeats): copies that have held longer are
    likelier to go on from the first cycle of a request, before any of its own evidence.
    """

    PRIOR_WEIGHT = 2.0  # pseudo-observations of the prior: a bin's first token cannot swing it to 0 or 1

    def __init__(self, edges: tuple[int, ...], prior: float | tuple[float, ...], memory: float) -> None:
        self.edges = np.asarray(edges, dtype=np.int64)
        self.prior = prior_ladder(prior, len(edges) + 1)
        self.keep = 1.0 - 1.0 / memory  # memory 1: keep 0, only the latest cycle counts
        self.tested = np.zeros(len(edges) + 1)
        self.accepted = np.zeros(len(edges) + 1)
        self.rates = self.prior.copy()

    def bins(self, depths: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.edges, depths, side="right")

    def profile(self, first_depth: int, length: int) -> np.ndarray:
        """Per-token acceptance of a ``length``-token draft whose first token is due at ``first_depth``."""
        return self.rates[self.bins(first_depth + np.arange(length))]

    def observe(self, depths: np.ndarray, accepted: np.ndarray) -> None:
        """Fold in tested draft tokens: their copy depths and whether each was accepted."""
        if depths.size == 0:
            return
        bins = self.bins(depths)
        size = self.tested.shape[0]
        count = np.bincount(bins, minlength=size).astype(np.float64)
        hits = np.bincount(bins, weights=accepted.astype(np.float64), minlength=size)
        fade = self.keep**count
        # the cycle's tokens weigh as if observed one after another: sum_k keep^k each bin
        weight = (1.0 - fade) / (1.0 - self.keep)
        self.tested = self.tested * fade + weight
        self.accepted = self.accepted * fade + weight * np.divide(hits, count, out=np.zeros(size), where=count > 0)
        self.rates = (self.accepted + self.PRIOR_WEIGHT * self.prior) / (self.tested + self.PRIOR_WEIGHT)

    def observe_draft(self, first_depth: int, outcome: VerifyOutcome, own_nodes: np.ndarray) -> None:
        """Fold in a source's draft from ``outcome`` (its nodes ``own_nodes``, as ``goose_observe`` gets them),
        hung off the anchor, whose first tokens were due at copy depth ``first_depth``: every tested token,
        at its own depth (a token at tree depth d is due at ``first_depth + d - 1``)."""
        tested = own_nodes & outcome.reached
        depths = outcome.tree.depths[tested]
        self.observe(first_depth + depths - 1, outcome.accepted[tested])
