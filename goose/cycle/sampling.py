"""Sampling that stays lossless: warped distributions and draws that depend only on (seed, position).

Temperature 0 (the default) is greedy decoding. Otherwise a token is drawn from the target's
distribution after the warpers ``model.generate(do_sample=True)`` applies, built from
transformers' own logits processors in generate's order (temperature, then top-k, then top-p), so
a sampled token means what it means in ``model.generate``.

The draw is inverse-CDF sampling with a uniform number that depends only on the seed and the
absolute position of the token being drawn (its index in prompt + output), from a counter-based
generator (SplitMix64 over the pair). The autoregressive sampler and Goose's sampled walk draw by
this same rule, so with the same seed they produce the same tokens: Goose only decides which rows
are already computed when the draw happens, never what is drawn. In float32 a seeded Goose run is
therefore token-identical to the seeded autoregressive sampler, whatever the sources drafted.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from goose.config import SamplingParams

_MASK64 = (1 << 64) - 1


def random_seed() -> int:
    """A fresh seed for a sampled run that was given none (reported back so the run can be replayed)."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice ``index`` of a request seeded ``seed`` that asks for several (OpenAI's ``n``): choice 0
    keeps ``seed`` (so n = 1 is the request alone), every other one gets its own stream of draws."""
    return seed if index == 0 else _splitmix64(_splitmix64(seed) ^ (index * 0x9E3779B97F4A7C15 & _MASK64)) >> 1


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def uniform(seed: int, position: int) -> float:
    """A uniform number in [0, 1) that depends only on ``seed`` and ``position`` (53 random bits)."""
    return (_splitmix64(_splitmix64(seed) ^ position) >> 11) * 2.0**-53


class Sampler:
    """Draws the target's token at a row: transformers' warpers, then inverse-CDF with ``uniform(seed, position)``.

    The warpers run on the warped distribution's support only, found with ``torch.topk`` rather than a
    sort of the whole vocabulary (top-p's sort of every drawn row is what makes sampling slow on a
    large vocabulary). This is exact, not an approximation:

    - top-k: ``TopKLogitsWarper`` (a ``topk``, no sort) leaves the support; top-p then sees exactly
      the values it would see.
    - top-p alone: the candidates are the m largest logits (ties included), m growing until they hold
      mass M >= top_p. Every other token is then removed by top-p (its ascending cumulative mass is at
      most 1 - M <= 1 - top_p), and top-p over the whole vocabulary removes a candidate exactly when
      top-p with threshold top_p / M over the candidates renormalised does.
    - temperature alone: the support is the whole vocabulary.

    Goose's walk and the autoregressive sampler both draw here (:meth:`draw_rows`; :meth:`draw` is
    one row of it), so they stay token-identical: a row's draw is the same whichever rows are warped
    with it, since every step works row by row (temperature, top-k, softmax, cumulative sum, search).
    """

    def __init__(self, params: SamplingParams, seed: int) -> None:
        if params.greedy:
            raise ValueError("a Sampler needs temperature > 0; temperature 0 is greedy decoding")
        self.params = params
        self.seed = seed
        self.temperature = TemperatureLogitsWarper(params.temperature) if params.temperature != 1.0 else None
        self.top_k = TopKLogitsWarper(top_k=params.top_k) if params.top_k else None
        self._no_ids = torch.zeros((1, 0), dtype=torch.long)

    def support(self, row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens the warpers keep for one row of logits [V] (ascending ids) and their probabilities."""
        no_ids = self._no_ids.to(row.device)
        scaled = row.float()[None]
        if self.temperature is not None:
            scaled = self.temperature(no_ids, scaled)
        if self.top_k is not None:
            scaled = self.top_k(no_ids, scaled)
        scaled = scaled[0]
        top_p = self.params.top_p
        if self.top_k is not None:
            ids = torch.nonzero(scaled > -torch.inf).flatten()
        elif top_p < 1.0:
            ids, top_p = _nucleus_candidates(scaled, top_p)
        else:
            ids = torch.arange(scaled.shape[0], device=scaled.device)
        warped = scaled[ids][None]
        if top_p < 1.0:
            warped = TopPLogitsWarper(top_p=top_p)(no_ids, warped)
        return ids, torch.softmax(warped[0], dim=-1)

    def probabilities(self, row: torch.Tensor) -> torch.Tensor:
        """The warped distribution [V] of one row of logits, in float32."""
        ids, probabilities = self.support(row)
        return torch.zeros(row.shape[-1], device=row.device).index_copy_(0, ids, probabilities)

    def draw(self, row: torch.Tensor, position: int) -> int:
        """The token at absolute ``position`` given the logits ``row`` [V] that predict it."""
        return int(self.draw_rows(row[None], [position])[0])

    def draw_rows(self, rows: torch.Tensor, positions: Sequence[int]) -> torch.Tensor:
        """The tokens at absolute ``positions`` given the logits ``rows`` [n, V] that predict them: int64 [n].

        The rows are warped and drawn together and the result stays on the device, so a caller that
        needs many rows' draws (the sampled walk) reads them all at once. Top-k finds its support's
        size with one read (the same size in every row unless the k-th value ties); top-p alone
        searches each row's candidates in turn, reading their mass.
        """
        uniforms = torch.tensor([uniform(self.seed, position) for position in positions], dtype=torch.float64)
        if self.top_k is None and self.params.top_p < 1.0:
            return torch.stack([ids[inverse_cdf(probabilities, uniforms[i : i + 1])[0]]
                                for i, (ids, probabilities) in enumerate(map(self.support, rows))])
        no_ids = self._no_ids.to(rows.device)
        scaled = rows.float()
        if self.temperature is not None:
            scaled = self.temperature(no_ids, scaled)
        if self.top_k is None:  # temperature alone: the support is the whole vocabulary
            return inverse_cdf(torch.softmax(scaled, dim=-1), uniforms[:, None])[:, 0]
        scaled = self.top_k(no_ids, scaled)
        kept = (scaled > -torch.inf).sum(dim=-1).tolist()
        if len(set(kept)) > 1:  # ties at the k-th value in some row: supports of different sizes
            return torch.cat([self.draw_rows(row[None], [position]) for row, position in zip(rows, positions,
                                                                                             strict=True)])
        ids = torch.topk(scaled, kept[0], dim=-1).indices.sort(dim=-1).values  # the support, ascending ids
        warped = scaled.gather(-1, ids)
        if self.params.top_p < 1.0:
            warped = TopPLogitsWarper(top_p=self.params.top_p)(no_ids, warped)
        chosen = inverse_cdf(torch.softmax(warped, dim=-1), uniforms[:, None])[:, 0]
        return ids.gather(-1, chosen[:, None])[:, 0]


def _largest_with_ties(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Ascending ids of the ``count`` largest scores and of every score tied with the smallest of them."""
    smallest_kept = torch.topk(scores, min(count, scores.shape[0])).values[-1]
    return torch.nonzero(scores >= smallest_kept).flatten()


def _nucleus_candidates(scaled: torch.Tensor, top_p: float) -> tuple[torch.Tensor, float]:
    """Candidates holding mass M >= ``top_p`` and the threshold (``top_p / M``) that top-p needs over them alone."""
    total = torch.logsumexp(scaled, dim=0)
    count = 64
    while count < scaled.shape[0]:
        ids = _largest_with_ties(scaled, count)
        mass = float(torch.exp(torch.logsumexp(scaled[ids], dim=0) - total))
        if mass >= top_p:
            return ids, min(top_p / mass, 1.0)
        count *= 4
    return torch.arange(scaled.shape[0], device=scaled.device), top_p


def inverse_cdf(probabilities: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """For each u in ``uniforms``, the first token whose cumulative mass exceeds u * total (never one of zero mass).

    One row (``probabilities`` [c], ``uniforms`` [m]: [m]) or a batch of rows (``probabilities`` [n, c],
    ``uniforms`` [n, m]: [n, m], row i's draws from row i's mass).
    """
    cumulative = torch.cumsum(probabilities, dim=-1)
    total = cumulative[..., -1:]
    thresholds = total * uniforms.to(cumulative.dtype).to(cumulative.device)
    indices = torch.searchsorted(cumulative, thresholds, right=True)
    # u * total can round up to the total (rare); then the draw is the first token where the mass reaches
    # the total, which has mass of its own. A minimum on the device, so no draw waits on a host check.
    return torch.minimum(indices, torch.searchsorted(cumulative, total, right=False))
