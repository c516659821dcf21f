"""Sampling that stays lossless: warped distributions and draws that depend only on (seed, position).

Temperature 0 (the default) is greedy decoding. Otherwise a token is drawn from the target's
distribution after the warpers ``model.generate(do_sample=True)`` applies, in generate's order
(temperature, then top-k, then top-p): transformers' own logits processors, except top-p without
top-k, which keeps the same tokens by the same rule over its candidates only. So a sampled token
means what it means in ``model.generate``.

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
    large vocabulary):

    - top-k: ``TopKLogitsWarper`` (a ``topk``, no sort) leaves the support; ``TopPLogitsWarper`` then
      sees exactly the values it would see.
    - top-p alone: the rows' softmax over the vocabulary, then their largest probabilities in
      descending order, their number growing until each row's nucleus is inside: a token is
      kept while the mass before it is below top_p, as ``TopPLogitsWarper`` keeps it (which breaks
      ties in its sort's order, so at a tied boundary the two may keep different tokens of equal mass).
    - temperature alone: the support is the whole vocabulary.

    Goose's walk and the autoregressive sampler both draw here (:meth:`draw_rows`; :meth:`draw` is
    one row of it), so they stay token-identical: a row's draw is the same whichever rows are warped
    with it. Every step works row by row (temperature, top-k, softmax, cumulative sum, search); no
    step sums a row with a reduction, whose order torch may split across threads for a lone row.
    """

    def __init__(self, params: SamplingParams, seed: int) -> None:
        if params.greedy:
            raise ValueError("a Sampler needs temperature > 0; temperature 0 is greedy decoding")
        self.params = params
        self.seed = seed
        self.temperature = TemperatureLogitsWarper(params.temperature) if params.temperature != 1.0 else None
        self.top_k = TopKLogitsWarper(top_k=params.top_k) if params.top_k else None
        self.top_p = TopPLogitsWarper(top_p=params.top_p) if params.top_p < 1.0 else None  # after top-k only
        self._no_ids = torch.zeros((1, 0), dtype=torch.long)

    def support(self, row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The tokens the warpers keep for one row of logits [V] (ascending ids) and their probabilities."""
        scaled = self._scaled(row[None])
        if self.top_k is None and self.params.top_p < 1.0:
            ids, masses = self._nucleus(torch.softmax(scaled, dim=-1))
            kept = ids[0] < row.shape[-1]  # not the padding
            return ids[0][kept], masses[0][kept] / masses[0].sum()
        no_ids = self._no_ids.to(row.device)
        if self.top_k is not None:
            scaled = self.top_k(no_ids, scaled)
        scaled = scaled[0]
        ids = (torch.nonzero(scaled > -torch.inf).flatten() if self.top_k is not None
               else torch.arange(scaled.shape[0], device=scaled.device))
        warped = scaled[ids][None]
        if self.top_p is not None:
            warped = self.top_p(no_ids, warped)
        return ids, torch.softmax(warped[0], dim=-1)

    def _scaled(self, rows: torch.Tensor) -> torch.Tensor:
        scaled = rows.float()
        return scaled if self.temperature is None else self.temperature(self._no_ids.to(rows.device), scaled)

    def _nucleus(self, probabilities: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-p alone over rows of probabilities [n, V]: each row's kept ids, ascending, and their masses [n, K].

        Rows keep different counts; the shorter ones end in id V with mass 0, which changes no
        cumulative sum and is never drawn. A row's nucleus is read from its ``count`` largest
        probabilities, ``count`` growing until the nucleus lies inside with no token tied with its
        last one left outside. That ``count`` depends on the row's values alone, so a row keeps the
        same tokens (ties at the boundary in topk's order) whichever rows are drawn with it.
        """
        vocabulary = probabilities.shape[-1]
        pending = torch.arange(probabilities.shape[0], device=probabilities.device)
        parts = []
        count = min(64, vocabulary)
        while pending.numel():
            candidates = probabilities if len(parts) == 0 else probabilities[pending]  # no copy in round one
            values, ids = torch.topk(candidates, count, dim=-1)
            cumulative = torch.cumsum(values, dim=-1)
            before = torch.cat([torch.zeros_like(cumulative[:, :1]), cumulative[:, :-1]], dim=-1)
            kept = (before < self.params.top_p).sum(dim=-1)  # a prefix: the cumulative mass never falls
            inside = values.gather(-1, (kept - 1)[:, None])[:, 0] > values[:, -1]
            if count == vocabulary:
                inside[:] = True
            parts.append((pending[inside], ids[inside], values[inside], kept[inside]))
            pending = pending[~inside]
            count = min(count * 4, vocabulary)
        width = int(torch.cat([kept for *_, kept in parts]).max())  # one read
        kept_ids = torch.full((probabilities.shape[0], width), vocabulary, device=probabilities.device)
        masses = torch.zeros((probabilities.shape[0], width), device=probabilities.device)
        for rows, ids, values, kept in parts:
            columns = min(width, ids.shape[1])
            padding = torch.arange(columns, device=ids.device)[None] >= kept[:, None]
            kept_ids[rows, :columns] = ids[:, :columns].masked_fill(padding, vocabulary)
            masses[rows, :columns] = values[:, :columns].masked_fill(padding, 0.0)
        kept_ids, order = kept_ids.sort(dim=-1)
        return kept_ids, masses.gather(-1, order)

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
        reads its candidates a round at a time, every row still open in one round (usually one).
        """
        uniforms = torch.tensor([uniform(self.seed, position) for position in positions], dtype=torch.float64)
        scaled = self._scaled(rows)
        if self.top_k is None:
            probabilities = torch.softmax(scaled, dim=-1)
            if self.params.top_p == 1.0:  # temperature alone: the support is the whole vocabulary
                return inverse_cdf(probabilities, uniforms[:, None])[:, 0]
            ids, masses = self._nucleus(probabilities)
            return ids.gather(-1, inverse_cdf(masses, uniforms[:, None]))[:, 0]
        scaled = self.top_k(self._no_ids.to(rows.device), scaled)
        kept = (scaled > -torch.inf).sum(dim=-1).tolist()
        if len(set(kept)) > 1:  # ties at the k-th value in some row: supports of different sizes
            return torch.cat([self.draw_rows(row[None], [position]) for row, position in zip(rows, positions,
                                                                                             strict=True)])
        ids = torch.topk(scaled, kept[0], dim=-1).indices.sort(dim=-1).values  # the support, ascending ids
        warped = scaled.gather(-1, ids)
        if self.top_p is not None:
            warped = self.top_p(self._no_ids.to(rows.device), warped)
        chosen = inverse_cdf(torch.softmax(warped, dim=-1), uniforms[:, None])[:, 0]
        return ids.gather(-1, chosen[:, None])[:, 0]


def inverse_cdf(probabilities: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """For each u in ``uniforms``, the first token whose cumulative mass exceeds u * total (never one of zero mass).

    One row (``probabilities`` [c], ``uniforms`` [m]: [m]) or a batch of rows (``probabilities`` [n, c],
    ``uniforms`` [n, m]: [n, m], row i's draws from row i's mass).
    """
    cumulative = torch.cumsum(probabilities, dim=-1)
    total = cumulative[..., -1:].contiguous()
    thresholds = total * uniforms.to(cumulative.dtype).to(cumulative.device)
    indices = torch.searchsorted(cumulative, thresholds, right=True)
    # u * total can round up to the total (rare); then the draw is the first token where the mass reaches
    # the total, which has mass of its own. A minimum on the device, so no draw waits on a host check.
    return torch.minimum(indices, torch.searchsorted(cumulative, total, right=False))
