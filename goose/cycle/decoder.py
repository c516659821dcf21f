"""The decoders: Goose speculative decoding, and the autoregressive loop it must reproduce.

Both turn prompts and options into requests and drive them through one engine, a
:class:`goose.cycle.session.Session` (the cycle, top to bottom, is there): a single request is a
session of one over the decoder's own verifier, many requests a session of several
(:meth:`_Decoding.batch`), every row drafting from sources the decoder lends it for the request
(:meth:`goose.cycle.drafting.Drafter.take_sources`). The autoregressive decoder drafts nothing:
every pass verifies the bare anchor, one token a row. ``model`` is a Hugging Face model (the torch
engine) or a GGUF file in llama.cpp (:class:`goose.llama_model.LlamaModel`); :mod:`goose.cycle.engine`
gives each its verifier.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from goose.config import GooseConfig, SamplingParams
from goose.cycle.drafting import Drafter
from goose.cycle.engine import Verifying, check_sources, eos_ids, new_verifier
from goose.cycle.logprobs import check_top_logprobs
from goose.cycle.request import GenerationResult, Prompt, Request, check_request
from goose.cycle.sampling import Sampler, random_seed
from goose.cycle.session import Chunk, Session
from goose.cycle.verifier import ContextOverflowError
from goose.planning.budget import BudgetPlanner
from goose.planning.cost import CostCurve

if TYPE_CHECKING:  # the grammar library loads only for a structured output
    from goose.grammar import Constraint


class _Decoding:
    """What the Goose decoder and the autoregressive loop share: prompts, options, the engine, results.

    ``tokenizer`` may be None when prompts are token ids (the text of a result is then empty).
    ``sampling``: the default temperature / top_p / top_k / seed of every call (each call may override).
    """

    drafter: Drafter | None = None

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, chat: bool = True,
                 sampling: SamplingParams | None = None, verifier: Verifying | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.chat = chat
        self.sampling = sampling or SamplingParams()
        # one request at a time: generate and stream (or any Verifying given: goose-bench's memo)
        self.verifier = verifier if verifier is not None else new_verifier(model)
        self.eos_ids = eos_ids(model, tokenizer)
        self.last_result: GenerationResult | None = None

    def stream(self, prompt: Prompt, max_new_tokens: int = 128, **options: Any) -> Iterator[Chunk]:
        """Yield the output as it is accepted; ``last_result`` holds the full result afterwards.

        ``options``: ``temperature``, ``top_p``, ``top_k``, ``seed`` (see :class:`SamplingParams`;
        None keeps the decoder's default) and ``eos_token_ids`` (the tokens that end the output;
        default: the model's and the tokenizer's EOS) and ``prediction`` (the expected output, text or
        token ids, as in OpenAI's Predicted Outputs: Goose drafts from it; the output is the same with
        or without it) and ``json_schema`` (a JSON schema, dict or JSON text: the output is JSON that
        follows it) or ``json_object=True`` (the output is a JSON object): structured outputs, every
        token drawn from the target's distribution restricted to what the grammar allows, the output
        ending (EOS) where the JSON is complete; a schema that cannot be compiled is a ValueError;
        and ``logprobs`` (None, the default: off; k in 0..20: every new token's log probability under
        the target's raw distribution (restricted by the grammar for a structured output) and its k
        most likely alternatives, on each chunk and on the result; the output is the same with or
        without it). Stopping the iteration ends the generation at the next cycle.
        """
        request = self.request(prompt, max_new_tokens, **options)
        session = Session(self.verifier, self.tokenizer, self.drafter)
        request_id = session.submit(request)
        result = None
        try:
            while session.active:
                for chunk in session.step():
                    result = chunk.result or result
                    paused = time.perf_counter()
                    yield chunk
                    session.idle(time.perf_counter() - paused)  # time spent in the consumer is not decoding time
        finally:  # the consumer stopped early (a stop string, a client gone) or an error: the slot is freed
            self.last_result = session.cancel(request_id) or result

    def generate(self, prompt: Prompt, max_new_tokens: int = 128, **options: Any) -> GenerationResult:
        """The whole output at once; ``options`` as for :meth:`stream`."""
        for _ in self.stream(prompt, max_new_tokens, **options):
            pass
        assert self.last_result is not None
        return self.last_result

    def batch(self, max_batch: int, cache_positions: int | None = None) -> Session:
        """A session decoding up to ``max_batch`` requests together (submit what :meth:`request` builds, step, cancel).

        ``cache_positions``: the KV cache's budget in positions over all slots (each request's prompt and
        output must fit a slot's equal share, or it is refused at submit); None: a slot holds the model's context.
        """
        return Session(new_verifier(self.model, max_batch, cache_positions), self.tokenizer, self.drafter)

    def generate_batch(self, prompts: list[Prompt], max_new_tokens: int = 128, max_batch: int | None = None,
                       cache_positions: int | None = None, **options: Any) -> list[GenerationResult]:
        """Decode ``prompts`` together (at most ``max_batch`` at once; default all): one result per prompt, in
        order, each the output that prompt gets alone. ``options`` as for :meth:`stream`, for every prompt (a
        ``seed`` seeds each prompt's own sampler); ``cache_positions`` as for :meth:`batch`."""
        if not prompts:
            return []
        session = self.batch(max_batch or len(prompts), cache_positions)
        requests = [self.request(prompt, max_new_tokens, **options) for prompt in prompts]
        ids = [session.submit(request) for request in requests]
        results = {chunk.request_id: chunk.result for chunk in session.run() if chunk.result is not None}
        return [results[i] for i in ids]

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of ``prompt``: a string goes through the chat template when the model has one."""
        from goose.models import encode_prompt

        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer; give token ids or pass the tokenizer")
            return encode_prompt(self.tokenizer, prompt, chat=self.chat)
        ids = prompt.flatten().tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
        if any(not isinstance(t, int) or t < 0 or t >= self.verifier.vocab_size for t in ids):
            raise ValueError(f"prompt token ids must be ints in [0, {self.verifier.vocab_size})")
        return ids

    def request(self, prompt: Prompt, max_new_tokens: int = 128, **options: Any) -> Request:
        """A request for a session's :meth:`~goose.cycle.session.Session.submit` (``options`` as for :meth:`stream`).
        Bad input raises here: ValueError (``ContextOverflowError`` for a prompt the context cannot hold), or
        TypeError for an unknown option."""
        check_request(prompt, max_new_tokens)
        eos_token_ids: Iterable[int] | None = options.pop("eos_token_ids", None)
        prediction: str | list[int] | None = options.pop("prediction", None)
        json_schema: dict[str, Any] | str | None = options.pop("json_schema", None)
        json_object: bool = bool(options.pop("json_object", False))
        top_logprobs = check_top_logprobs(options.pop("logprobs", None))
        unknown = set(options) - set(SamplingParams.model_fields)
        if unknown:
            raise TypeError(f"unknown generation option(s): {', '.join(sorted(unknown))}")
        sampling = self.sampling.model_copy(update={k: v for k, v in options.items() if v is not None})
        sampling = SamplingParams.model_validate(sampling.model_dump())  # validates the overrides too
        ids = self.encode(prompt)
        if len(ids) >= self.verifier.max_positions:
            raise ContextOverflowError(
                f"prompt of {len(ids)} tokens does not fit the model's context of {self.verifier.max_positions}"
            )
        eos = self.eos_ids if eos_token_ids is None else frozenset(int(t) for t in eos_token_ids)
        sampler = None if sampling.greedy else Sampler(sampling, random_seed() if sampling.seed is None
                                                       else sampling.seed)
        return Request(ids, max_new_tokens, eos, sampler, self._prediction_ids(prediction, len(ids)),
                       self._constraint(json_schema, json_object, eos), top_logprobs)

    def _constraint(self, json_schema: dict[str, Any] | str | None, json_object: bool,
                    eos: frozenset[int]) -> Constraint | None:
        """The grammar of a structured output (None, and no grammar library loaded, for a free-form one)."""
        if json_schema is None and not json_object:
            return None
        from goose.grammar import Constraint, GrammarCompiler, schema_text

        schema = schema_text(json_schema, json_object)
        assert schema is not None
        return Constraint(GrammarCompiler.of(self.tokenizer, self.verifier.vocab_size), schema, eos)

    def _prediction_ids(self, prediction: str | list[int] | None, prompt_length: int) -> np.ndarray | None:
        """The prediction's token ids (text is tokenized without special tokens); ValueError naming what is wrong."""
        if prediction is None:
            return None
        if isinstance(prediction, str):
            if self.tokenizer is None:
                raise ValueError("a text prediction needs a tokenizer; give token ids or pass the tokenizer")
            ids = self.tokenizer.encode(prediction, add_special_tokens=False)
        elif isinstance(prediction, list | tuple) and all(isinstance(t, int) and not isinstance(t, bool)
                                                          for t in prediction):
            ids = list(prediction)
            if any(t < 0 or t >= self.verifier.vocab_size for t in ids):
                raise ValueError(f"prediction token ids must be ints in [0, {self.verifier.vocab_size})")
        else:
            raise ValueError(f"prediction must be text or a list of token ids, not {type(prediction).__name__}")
        if not ids:
            raise ValueError("prediction is empty: give the expected output's text, or no prediction")
        if prompt_length + len(ids) >= self.verifier.max_positions:
            raise ValueError(f"prediction of {len(ids)} tokens with a prompt of {prompt_length} does not fit the "
                             f"model's context of {self.verifier.max_positions}")
        array = np.asarray(ids, dtype=np.int64)
        array.flags.writeable = False
        return array


class AutoregressiveDecoder(_Decoding):
    """Plain decoding, one token per forward, through the same engine as Goose (greedy or sampled).

    ``verifier``: what one request at a time verifies through (default: a new one of the model's engine).
    """


class GooseDecoder(_Decoding):
    """Goose speculative decoding: multi-source candidates, a planned draft tree, one verify pass per cycle.

    What it drafts with, and what ``cost_curve`` and ``pinned_costs`` do: :class:`goose.cycle.drafting.Drafter`;
    ``profile``: time each phase of the cycle (``stats.profile``); ``verifier``: as for the autoregressive decoder.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None,
        config: GooseConfig | None = None,
        *,
        chat: bool = True,
        profile: bool = False,
        cost_curve: CostCurve | None = None,
        pinned_costs: bool = False,
        verifier: Verifying | None = None,
        **overrides: Any,
    ) -> None:
        self.config = (config or GooseConfig()).merged(overrides) if overrides else config or GooseConfig()
        super().__init__(model, tokenizer, chat, self.config.sampling_params(), verifier)
        self.drafter = Drafter(model, tokenizer, self.config, self.verifier.vocab_size, profile, cost_curve,
                               pinned_costs)
        check_sources(model, self.drafter.sources)
        self.sources, self.topology, self.source_names = self.drafter.sources, self.drafter.topology, \
            self.drafter.source_names

    @property
    def budget_planner(self) -> BudgetPlanner | None:
        """The planner that prices rows with the cost curve (see :attr:`Drafter.budget_planner`)."""
        return self.drafter.budget_planner if self.drafter is not None else None


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    prompt: Prompt,
    max_new_tokens: int = 128,
    *,
    sources: list[str] | None = None,
    topology: str | None = None,
    budget: int | str | None = None,
    config: GooseConfig | None = None,
    chat: bool = True,
    **options: Any,
) -> GenerationResult:
    """Generate with Goose: token-identical to plain decoding (greedy, or seeded sampling), in fewer passes.

    ``options``: ``temperature``, ``top_p``, ``top_k``, ``seed``, ``eos_token_ids``, ``prediction``,
    ``json_schema``, ``json_object`` (see ``GooseDecoder.stream``).
    """
    config = (config or GooseConfig()).merged({"sources": sources, "topology": topology, "budget": budget})
    return GooseDecoder(model, tokenizer, config, chat=chat).generate(prompt, max_new_tokens, **options)


def autoregressive(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, prompt: Prompt, max_new_tokens: int = 128,
    *, chat: bool = True, **options: Any,
) -> GenerationResult:
    """Plain decoding through the same plumbing (greedy, or the seeded sampler): the baseline Goose must reproduce."""
    return AutoregressiveDecoder(model, tokenizer, chat).generate(prompt, max_new_tokens, **options)


__all__ = ["AutoregressiveDecoder", "GenerationResult", "GooseDecoder", "autoregressive", "generate"]
