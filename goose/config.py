"""Decoding configuration: what every run needs, with the paper's defaults (arXiv 2604.02047).

A plugin's own settings, the built-in topologies' included (the spine's tiers and ablations, Iso(k)'s k), live
in its options model, given here under its name in ``source_options`` / ``topology_options``; an ablation is
a config change, never a code change.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError


def first_error(error: ValidationError, what: str = "config") -> str:
    """A pydantic validation error as one line: where (the field path) and what is wrong."""
    first = error.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or what
    return f"{where}: {first['msg']}"


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when ``name`` is close to one of ``known`` (difflib's measure), else ``""``."""
    near = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def unknown_field(error: ValidationError, model: type[BaseModel]) -> ValidationError:
    """``error`` with each unknown top-level field of ``model`` saying which field was probably meant (or, with none
    near, which exist); still pydantic's ``extra_forbidden``, so callers that map that type keep working."""
    fields, details = list(model.model_fields), []
    for problem in error.errors(include_url=False):
        if problem["type"] == "extra_forbidden" and len(problem["loc"]) == 1:
            near = did_you_mean(problem["loc"][0], fields)
            message = f"unknown {model.__name__} field" + (near or f"; fields: {', '.join(fields)}")
            problem = InitErrorDetails(type=PydanticCustomError("extra_forbidden", message), loc=problem["loc"],
                                       input=problem["input"])
        details.append(problem)
    return ValidationError.from_exception_data(error.title, details)  # type: ignore[arg-type]


class Sampling(BaseModel):
    """What is decoded: greedy (temperature 0) or sampled. The sampling fields, declared once: GooseConfig
    carries them as a decoder's defaults, SamplingParams as one call's (every call may override them)."""

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


class SamplingParams(Sampling):
    """One call's validated sampling settings; bad values raise pydantic's ValidationError (a ValueError)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class GooseConfig(Sampling):
    """Everything that shapes one Goose generation. Defaults are the paper's (the sampling fields: greedy)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # which plugins take part
    sources: list[str] = Field(default_factory=lambda: ["context_match", "bigram_transition"])
    topology: str = "spine"

    # tree shape, every planner's (max_depth: the automatic budget's yield model too)
    budget: int | Literal["auto"] = Field(
        default="auto",
        description="draft-tree node budget B (anchor excluded); 'auto' picks, every cycle, the size the device's "
        "measured cost curve and the acceptance estimates say is fastest (the paper's fixed B=60 is a GPU setting)",
    )
    max_depth: int = Field(default=6, ge=1, description="max depth of a branch expanded through successors")
    min_score: float = Field(
        default=0.01, ge=0.0,
        description="a successor whose own score (the target's probability of it after its parent, as harvested) "
        "is below this is not drafted (the paper's floor; nodes are still ranked by path score)")
    spine_extension: int = Field(
        default=40, ge=0,
        description="with a fixed budget (the paper's setting) a draft may run this many nodes past the budget on "
        "the spine: the budget prices the branches, and a copy the target keeps accepting is verified whole "
        "(the paper's code extends a confident chain to 100 nodes at B = 60). The automatic budget sizes the whole "
        "tree, spine included, by the cost curve instead; 0: the budget caps the spine too",
    )
    # pricing: every row of a pass against the cost curve (see goose.planning.budget)
    price_rows: bool = Field(
        default=True,
        description="auxiliary rows (Lookahead's window) ride in a pass only when the cost curve says the tokens "
        "they bring pay for them; False: they always ride (the plain method)",
    )
    probe_every: int = Field(
        default=16, ge=1, description="rows that do not pay still ride once in this many cycles, to stay measured"
    )

    # sources' shared conventions
    ema: float = Field(default=0.3, gt=0.0, le=1.0, description="EMA coefficient of acceptance estimates")
    initial_acceptance: dict[str, float] = Field(
        default_factory=dict,
        description="per source name: its acceptance estimate before any verification (default: the value the "
        "source registered with)",
    )
    harvest_top_k: int = Field(default=10, ge=1, description="top-k of every verified position sent to observers")
    prefill_harvest: int | Literal["auto"] | None = Field(
        default="auto",
        description="prompt positions (the last ones) whose top-k is harvested at prefill; None = all; 'auto': "
        "none with the automatic budget (each is an output-layer row computed before the first token, which is to "
        "be no later than plain decoding's), every row with a fixed budget (the paper's setting)",
    )
    source_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-source options, validated by each source's own model"
    )
    topology_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="per-topology options, validated by each topology's own model "
        "(e.g. {\"spine\": {\"split\": \"tiers\"}})"
    )
    batch_shared_sources: list[str] | Literal["auto"] = Field(
        default="auto",
        description="sources whose one instance serves every row of a batch (knowledge of the model, not of "
        "the request, e.g. bigram_transition's table); each row still keeps its own acceptance estimates. "
        "A shared source is not reset when a row joins. 'auto': every source the decoder drafts from that "
        "registered itself shareable; []: every row its own instances",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _near_misses(cls, data: Any, handler: ModelWrapValidatorHandler[GooseConfig]) -> GooseConfig:
        try:
            return handler(data)
        except ValidationError as error:
            if not any(problem["type"] == "extra_forbidden" for problem in error.errors(include_url=False)):
                raise
            raise unknown_field(error, cls) from None

    @field_validator("budget")
    @classmethod
    def _budget_positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("budget must be >= 1 draft node (or 'auto')")
        return value

    @field_validator("prefill_harvest")
    @classmethod
    def _harvest_not_negative(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 0:
            raise ValueError("prefill_harvest must be >= 0 prompt positions, 'auto' or None (all)")
        return value

    @field_validator("sources")
    @classmethod
    def _sources_nonempty(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"sources listed twice: {value}")
        return value

    @field_validator("initial_acceptance")
    @classmethod
    def _probabilities(cls, value: dict[str, float]) -> dict[str, float]:
        outside = {name: rate for name, rate in value.items() if not 0.0 <= rate <= 1.0}
        if outside:
            raise ValueError(f"initial acceptance must lie in [0, 1]: {outside}")
        return value

    def fixed_budget(self) -> int:
        """The nodes a tree may hold with a fixed budget: the budget, and the main spine's extension past it."""
        assert self.budget != "auto"
        return int(self.budget) + self.spine_extension

    def digest(self) -> dict[str, Any]:
        """What defines this configuration in a result row: its sources, topology, budget and per-source options,
        and every other field that differs from the default (``changed``)."""
        mine, defaults = self.model_dump(mode="json"), GooseConfig().model_dump(mode="json")
        named = ("sources", "topology", "budget", "source_options", "topology_options")
        return {**{key: mine[key] for key in named},
                "changed": {key: value for key, value in mine.items() if key not in named and value != defaults[key]}}

    def options_for(self, plugin: str) -> dict[str, Any]:
        """A source's or a topology's own options (``source_options`` / ``topology_options`` under its name)."""
        return {**self.topology_options.get(plugin, {}), **self.source_options.get(plugin, {})}

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(**{name: getattr(self, name) for name in Sampling.model_fields})

    def merged(self, overrides: dict[str, Any]) -> GooseConfig:
        """This config with ``overrides`` (field -> value; None values are left out) applied, validated."""
        return GooseConfig.model_validate(self.model_dump() | {k: v for k, v in overrides.items() if v is not None})


__all__ = ["GooseConfig", "Sampling", "SamplingParams", "did_you_mean", "first_error"]
