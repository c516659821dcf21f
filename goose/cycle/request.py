"""One request through the cycle: its tokens, stopping rule, sampler, grammar and log probabilities; its result."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from goose.cycle.logprobs import TokenLogprob, token_logprobs
from goose.cycle.readout import greedy
from goose.cycle.sampling import Sampler
from goose.cycle.stats import GenerationStats

if TYPE_CHECKING:  # the grammar library loads only for a structured output
    from goose.grammar import Constraint

Prompt = str | list[int] | torch.Tensor


def check_request(prompt: Prompt, max_new_tokens: int) -> None:
    """Refuse what no model could decode (an empty prompt, a non-positive token budget), before any work."""
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    if isinstance(prompt, str) and not prompt.strip():
        raise ValueError("empty prompt: give some text to continue")
    if not isinstance(prompt, str) and len(prompt) == 0:
        raise ValueError("empty prompt: give at least one token id")


@dataclass
class GenerationResult:
    """What a generation returns: the new tokens, their text, why it stopped, and its statistics.

    ``seed``: the seed of a sampled run (the one given, or the random one picked), None when greedy.
    ``logprobs``: with the ``logprobs`` option, one entry per new token (see :mod:`goose.cycle.logprobs`).
    """

    prompt_ids: list[int]
    new_token_ids: list[int]
    text: str
    stop_reason: str  # "eos", "max_new_tokens", "context_full", or "stopped" (the stream's consumer stopped early)
    stats: GenerationStats
    seed: int | None = None
    logprobs: list[TokenLogprob] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "new_token_ids": self.new_token_ids, "stop_reason": self.stop_reason,
                "seed": self.seed, **self.stats.to_dict(),
                **({"logprobs": [entry.to_dict() for entry in self.logprobs]} if self.logprobs is not None else {})}


@dataclass
class Request:
    """Per-request state: the token buffer (prompt, then output), the stopping rule, the sampler, the statistics."""

    prompt_ids: list[int]
    max_new_tokens: int
    eos_ids: frozenset[int]
    sampler: Sampler | None = None
    prediction: np.ndarray | None = None  # the predicted output's token ids (read-only), if the request has one
    constraint: Constraint | None = None  # the grammar the output must follow (structured outputs), if any
    top_logprobs: int | None = None  # None: no log probabilities; else the alternatives reported per token
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per output token, with top_logprobs set
    stats: GenerationStats = field(default_factory=GenerationStats)
    started: float = field(default_factory=time.perf_counter)  # when its decoding began (its wall time's start)
    buffer: np.ndarray = field(init=False)
    length: int = field(init=False)
    stop_reason: str | None = None

    def __post_init__(self) -> None:
        self.buffer = np.zeros(len(self.prompt_ids) + self.max_new_tokens + 1, dtype=np.int64)
        self.buffer[: len(self.prompt_ids)] = self.prompt_ids
        self.length = len(self.prompt_ids)

    @property
    def produced(self) -> int:
        return self.length - len(self.prompt_ids)

    @property
    def tokens(self) -> np.ndarray:
        view = self.buffer[: self.length]
        view.flags.writeable = False
        return view

    def next_token(self, row: torch.Tensor, position: int) -> int:
        """The target's token at ``position`` from the logits ``row`` that predict it: argmax, or a seeded draw
        (of a constrained request: from ``row`` masked in place by the grammar at the committed output)."""
        if self.constraint is not None:
            self.constraint.apply(row[None], self.constraint.next_mask())
        return int(greedy(row[None])[0]) if self.sampler is None else self.sampler.draw(row, position)

    def accept(self, tokens: list[int]) -> list[int]:
        """Append tokens up to the limit and through the first EOS; returns what was appended."""
        kept = tokens[: self.max_new_tokens - self.produced]
        if not self.eos_ids.isdisjoint(kept):  # one set operation in the usual case: no EOS among them
            kept = kept[: next(i for i, token in enumerate(kept) if token in self.eos_ids) + 1]
            self.stop_reason = "eos"
        if self.constraint is not None:
            self.constraint.advance(kept)
        self.buffer[self.length : self.length + len(kept)] = kept
        self.length += len(kept)
        if self.stop_reason is None and self.produced >= self.max_new_tokens:
            self.stop_reason = "max_new_tokens"
        return kept

    def accept_scored(self, tokens: list[int], logits: torch.Tensor, rows: Sequence[int]) -> list[int]:
        """:meth:`accept`, and the kept tokens' log probabilities when the request asks for them (row
        ``rows[i]`` of ``logits`` predicted ``tokens[i]``); without the option this is :meth:`accept`."""
        kept = self.accept(tokens)
        if self.top_logprobs is not None and kept:
            self.logprobs += token_logprobs(logits, rows[: len(kept)], kept, self.top_logprobs)
        return kept

    def step_plainly(self, logits: torch.Tensor) -> list[int]:
        """A plain decoding step: the token the anchor's row ``logits`` [1, V] predicts."""
        kept = self.accept_scored([self.next_token(logits[0], self.length)], logits, [0])
        self.stats.verify_steps += 1
        self.stats.accepted_lengths.append(len(kept))
        return kept

    def recent_logprobs(self, count: int) -> list[TokenLogprob] | None:
        """The log probabilities of the last ``count`` tokens (None without the option)."""
        if self.top_logprobs is None:
            return None
        return self.logprobs[len(self.logprobs) - count :]

    def result(self, tokenizer: Any) -> GenerationResult:
        """The request's result so far (``tokenizer`` None: no text)."""
        stats = self.stats
        stats.wall_s = time.perf_counter() - self.started
        new_ids = self.tokens[len(self.prompt_ids) :].tolist()
        stats.new_tokens = len(new_ids)
        text = tokenizer.decode(new_ids, skip_special_tokens=True) if tokenizer is not None else ""
        if self.constraint is not None:
            stats.constrained = True
            stats.grammar_s = self.constraint.seconds
            stats.grammar_cut_tokens = self.constraint.cut_tokens
        return GenerationResult(self.prompt_ids, new_ids, text, self.stop_reason or "context_full", stats,
                                self.sampler.seed if self.sampler is not None else None,
                                list(self.logprobs) if self.top_logprobs is not None else None)
