"""Sampling parameters: what a user sets to sample instead of decoding greedily.

Temperature 0 (the default) is greedy decoding. Otherwise every token is drawn from the target's
distribution after the warpers ``model.generate(do_sample=True)`` applies (temperature, top-k,
top-p), with a random draw that depends only on the seed and the token's position, so a seeded
Goose run reproduces the seeded autoregressive sampler token for token.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    """Validated sampling settings; bad values raise pydantic's ValidationError (a ValueError)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(default=0.0, ge=0.0, allow_inf_nan=False,
                               description="0: greedy decoding; > 0: sample from softmax(logits / temperature)")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False,
                         description="nucleus sampling: keep the smallest set of tokens holding this much mass")
    top_k: int = Field(default=0, ge=0, description="keep the k most likely tokens; 0: no top-k cut")
    seed: int | None = Field(default=None, ge=0, lt=2**63,
                             description="seed of the per-position draws; None: a random seed, reported back")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
