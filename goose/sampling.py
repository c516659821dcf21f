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
from typing import Annotated

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

# The sampling fields, defined once: GooseConfig and SamplingParams share them.
Temperature = Annotated[float, Field(ge=0.0, allow_inf_nan=False,
                                     description="0: greedy decoding; > 0: sample from softmax(logits / temperature)")]
TopP = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False,
                              description="nucleus sampling: keep the smallest set of tokens holding this much mass")]
TopK = Annotated[int, Field(ge=0, description="keep the k most likely tokens; 0: no top-k cut")]
Seed = Annotated[int | None, Field(ge=0, lt=2**63,
                                   description="seed of the per-position draws; None: a random seed, reported back")]

_MASK64 = (1 << 64) - 1


class SamplingParams(BaseModel):
    """Validated sampling settings; bad values raise pydantic's ValidationError (a ValueError)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: Temperature = 0.0
    top_p: TopP = 1.0
    top_k: TopK = 0
    seed: Seed = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def random_seed() -> int:
    """A fresh seed for a sampled run that was given none (reported back so the run can be replayed)."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def uniform(seed: int, position: int) -> float:
    """A uniform number in [0, 1) that depends only on ``seed`` and ``position`` (53 random bits)."""
    return (_splitmix64(_splitmix64(seed) ^ position) >> 11) * 2.0**-53


class Sampler:
    """Draws the target's token at a row: transformers' warpers, then inverse-CDF with ``uniform(seed, position)``."""

    def __init__(self, params: SamplingParams, seed: int) -> None:
        if params.greedy:
            raise ValueError("a Sampler needs temperature > 0; temperature 0 is greedy decoding")
        self.params = params
        self.seed = seed
        warpers: list[object] = []
        if params.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k:
            warpers.append(TopKLogitsWarper(top_k=params.top_k))
        if params.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=params.top_p))
        self.warpers = LogitsProcessorList(warpers)
        self._no_ids = torch.zeros((1, 0), dtype=torch.long)

    def probabilities(self, row: torch.Tensor) -> torch.Tensor:
        """The warped distribution [V] of one row of logits, in float32."""
        warped = self.warpers(self._no_ids.to(row.device), row.float()[None])
        return torch.softmax(warped[0], dim=-1)

    def draw(self, row: torch.Tensor, position: int) -> int:
        """The token at absolute ``position`` given the logits ``row`` [V] that predict it."""
        return int(inverse_cdf(self.probabilities(row), torch.tensor([uniform(self.seed, position)]))[0])


def inverse_cdf(probabilities: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """For each u in ``uniforms``, the first token whose cumulative mass exceeds u * total (never one of zero mass)."""
    cumulative = torch.cumsum(probabilities, dim=-1)
    thresholds = cumulative[-1] * uniforms.to(cumulative.dtype).to(cumulative.device)
    indices = torch.searchsorted(cumulative, thresholds, right=True)
    # u * total can round up to the total (rare); then the draw is the first token where the mass reaches
    # the total, which has mass of its own. A minimum on the device, so no draw waits on a host check.
    return torch.minimum(indices, torch.searchsorted(cumulative, cumulative[-1:], right=False))
