"""The Goose cycle, top to bottom, and the autoregressive loop it must reproduce.

One cycle: every source proposes -> the topology plans a draft tree -> the verifier runs the
tree through the target in one pass -> the walker takes the longest agreed path plus the bonus
token -> every source observes the outcome (accepted path, each node's fate, top-k of every
verified row). Greedy, the output is token for token the target's greedy decoding; sampled (with a
seed), the seeded autoregressive sampler's. Sources and topologies only change how many tokens
each forward pass yields.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from goose.config import GooseConfig
from goose.contract.boundary import FaultLog, SourceSet, TopologyPlanner
from goose.contract.candidates import CandidatePool, DecodeContext
from goose.contract.outcome import AuxiliaryRows, Harvest, VerifyOutcome
from goose.contract.tree import ROOT, DraftTree
from goose.cycle.detokenize import IncrementalText
from goose.cycle.logprobs import TokenLogprob, check_top_logprobs, token_logprobs
from goose.cycle.readout import greedy, greedy_and_top_k, read
from goose.cycle.sampling import Sampler, SamplingParams, random_seed
from goose.cycle.stats import GenerationStats
from goose.cycle.verifier import ContextOverflowError, Verifier
from goose.cycle.walker import walk, walk_sampled
from goose.planning.budget import BudgetPlanner
from goose.planning.cost import CostCurve, harvest_rows, load_or_measure, output_layer_weight
from goose.plugins import PluginError

if TYPE_CHECKING:
    from goose.cycle.batch import BatchSession
    from goose.cycle.grammar import Constraint

Prompt = str | list[int] | torch.Tensor


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


@dataclass(frozen=True)
class Chunk:
    """One streamed piece: the tokens a cycle appended, the text they complete, and their log probabilities
    (with the ``logprobs`` option)."""

    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None = None


def check_request(prompt: Prompt, max_new_tokens: int) -> None:
    """Refuse what no model could decode (an empty prompt, a non-positive token budget), before any work."""
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    if isinstance(prompt, str) and not prompt.strip():
        raise ValueError("empty prompt: give some text to continue")
    if not isinstance(prompt, str) and len(prompt) == 0:
        raise ValueError("empty prompt: give at least one token id")


@dataclass
class _Request:
    """Per-request state: the token buffer (prompt, then output), the stopping rule and the sampler."""

    prompt_ids: list[int]
    max_new_tokens: int
    eos_ids: frozenset[int]
    sampler: Sampler | None = None
    prediction: np.ndarray | None = None  # the predicted output's token ids (read-only), if the request has one
    constraint: Constraint | None = None  # the grammar the output must follow (structured outputs), if any
    top_logprobs: int | None = None  # None: no log probabilities; else the alternatives reported per token
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per output token, with top_logprobs set
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
        for i, token in enumerate(kept):
            if token in self.eos_ids:
                kept = kept[: i + 1]
                self.stop_reason = "eos"
                break
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

    def recent_logprobs(self, count: int) -> list[TokenLogprob] | None:
        """The log probabilities of the last ``count`` tokens (None without the option)."""
        if self.top_logprobs is None:
            return None
        return self.logprobs[len(self.logprobs) - count :]


class _Decoding:
    """What the Goose decoder and the autoregressive loop share: prompts, sampling, stopping, results.

    ``tokenizer`` may be None when prompts are token ids (the text of a result is then empty).
    ``sampling``: the default temperature / top_p / top_k / seed of every call (each call may override).
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, chat: bool = True,
                 sampling: SamplingParams | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.chat = chat
        self.sampling = sampling or SamplingParams()
        self.verifier = Verifier(model)
        self.eos_ids = _eos_ids(model, tokenizer)
        self.last_result: GenerationResult | None = None

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

    def _request(self, prompt: Prompt, max_new_tokens: int, options: dict[str, Any]) -> _Request:
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
        return _Request(ids, max_new_tokens, eos, sampler, self._prediction_ids(prediction, len(ids)),
                        self._constraint(json_schema, json_object, eos), top_logprobs)

    def _constraint(self, json_schema: dict[str, Any] | str | None, json_object: bool,
                    eos: frozenset[int]) -> Constraint | None:
        """The grammar of a structured output (None, and no grammar library loaded, for a free-form one)."""
        if json_schema is None and not json_object:
            return None
        from goose.cycle.grammar import Constraint, GrammarCompiler, schema_text

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
        request = self._request(prompt, max_new_tokens, dict(options))
        stats = GenerationStats()
        started = time.perf_counter()
        text = IncrementalText(self.tokenizer)
        try:
            for token_ids in self._cycles(request, stats):
                stats.new_tokens = request.produced
                piece = text.add(token_ids)
                if request.stop_reason is not None:
                    piece += text.finish()
                paused = time.perf_counter()
                yield Chunk(token_ids, piece, request.recent_logprobs(len(token_ids)))
                started += time.perf_counter() - paused  # time spent in the consumer is not decoding time
        except GeneratorExit:  # the consumer stopped early (a stop string, a client gone)
            request.stop_reason = request.stop_reason or "stopped"
            raise
        finally:
            self.last_result = self._result(request, stats, started)

    def generate(self, prompt: Prompt, max_new_tokens: int = 128, **options: Any) -> GenerationResult:
        """The whole output at once; ``options`` as for :meth:`stream`."""
        request = self._request(prompt, max_new_tokens, dict(options))
        stats = GenerationStats()
        started = time.perf_counter()
        for _ in self._cycles(request, stats):
            pass
        self.last_result = self._result(request, stats, started)
        return self.last_result

    def _result(self, request: _Request, stats: GenerationStats, started: float) -> GenerationResult:
        stats.wall_s = time.perf_counter() - started
        new_ids = request.tokens[len(request.prompt_ids) :].tolist()
        stats.new_tokens = len(new_ids)
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True) if self.tokenizer is not None else ""
        seed = request.sampler.seed if request.sampler is not None else None
        if request.constraint is not None:
            stats.constrained = True
            stats.grammar_s = request.constraint.seconds
            stats.grammar_cut_tokens = request.constraint.cut_tokens
        logprobs = list(request.logprobs) if request.top_logprobs is not None else None
        return GenerationResult(request.prompt_ids, new_ids, text, request.stop_reason or "context_full", stats, seed,
                                logprobs)

    def batch(self, max_batch: int, cache_positions: int | None = None) -> BatchSession:
        """A session decoding up to ``max_batch`` requests together (submit, step, cancel).

        ``cache_positions``: the KV cache's budget in positions over all slots (each request's prompt and
        output must fit a slot's equal share, or it is refused at submit); None: a slot holds the model's context.
        """
        from goose.cycle.batch import BatchSession

        return BatchSession(self, max_batch, cache_positions)

    def generate_batch(self, prompts: list[Prompt], max_new_tokens: int = 128, max_batch: int | None = None,
                       cache_positions: int | None = None, **options: Any) -> list[GenerationResult]:
        """Decode ``prompts`` together (at most ``max_batch`` at once; default all): one result per prompt, in
        order, each the output that prompt gets alone. ``options`` as for :meth:`stream`, for every prompt;
        ``cache_positions`` as for :meth:`batch`."""
        from goose.cycle.batch import generate_batch

        return generate_batch(self, prompts, max_new_tokens, max_batch, cache_positions, **options)

    def _prefill(self, request: _Request, stats: GenerationStats, harvest_rows: int) -> torch.Tensor:
        started = time.perf_counter()
        logits = self.verifier.prefill(request.prompt_ids, logits_to_keep=harvest_rows + 1)
        request.accept_scored([request.next_token(logits[-1], request.length)], logits, [logits.shape[0] - 1])
        stats.prefill_s = time.perf_counter() - started
        return logits

    def _cycles(self, request: _Request, stats: GenerationStats) -> Iterator[list[int]]:
        raise NotImplementedError


class AutoregressiveDecoder(_Decoding):
    """Plain decoding, one token per forward, through the same verifier plumbing as Goose (greedy or sampled)."""

    def _cycles(self, request: _Request, stats: GenerationStats) -> Iterator[list[int]]:
        self._prefill(request, stats, harvest_rows=0)
        yield request.tokens[-1:].tolist()
        while request.stop_reason is None and self.verifier.past_length + 1 < self.verifier.max_positions:
            tree = DraftTree.single(int(request.tokens[-1]))
            logits = self.verifier.verify(tree)
            self.verifier.commit(tree.tokens[:0])
            kept = request.accept_scored([request.next_token(logits[0], request.length)], logits, [0])
            stats.verify_steps += 1
            stats.accepted_lengths.append(len(kept))
            yield kept


class GooseDecoder(_Decoding):
    """Goose speculative decoding: multi-source candidates, a planned draft tree, one verify pass per cycle.

    Sources and the topology are made once per decoder (their state, such as a persistent
    adjacency table or the acceptance estimates, lives as long as the decoder). With
    ``budget="auto"`` the budget follows ``cost_curve``, or this device's measured curve, loaded
    (and measured once, if no cached one exists) when the first generation needs it.
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
        **overrides: Any,
    ) -> None:
        base = config or GooseConfig()
        self.config = GooseConfig.model_validate({**base.model_dump(), **overrides}) if overrides else base
        super().__init__(model, tokenizer, chat, self.config.sampling_params())
        if not self.config.sources:
            raise PluginError("no sources enabled: name at least one with --sources")
        faults = FaultLog()
        self.sources = SourceSet(self.config.sources, self.config, self.verifier.vocab_size, faults=faults)
        self.topology = TopologyPlanner(self.config.topology, self.config, self.verifier.vocab_size, faults=faults)
        self.profile = profile
        self._cost_curve = cost_curve
        self._budget_planner: BudgetPlanner | None = None
        self._cycles_unpriced: dict[str, int] = {}  # per source: cycles since its auxiliary rows last rode
        self._predicting: SourceSet | None = None  # self.sources plus the prediction source (see _sources_for)
        self._output_row_weight = output_layer_weight(model)  # prices the prefill harvest (prefill_harvest="auto")
        self.draw_all_rows = False  # sampled: draw every tree row in one batch on the CPU too (as on a GPU)

    @property
    def budget_planner(self) -> BudgetPlanner | None:
        """The planner that prices rows with the cost curve: for the automatic budget and for auxiliary rows.

        None with a fixed budget and no row to price; its cost curve is loaded on first use.
        """
        prices_rows = self.config.price_rows and any(self.sources.implements(name, "goose_auxiliary_rows")
                                                     for name in self.sources.names)
        if self.config.budget != "auto" and not prices_rows:
            return None
        if self._budget_planner is None:
            curve = self._cost_curve if self._cost_curve is not None else load_or_measure(self.model)
            self._budget_planner = BudgetPlanner(curve, max_depth=self.config.max_depth)
        return self._budget_planner

    def _cycles(self, request: _Request, stats: GenerationStats) -> Iterator[list[int]]:
        verifier, budget_planner = self.verifier, self.budget_planner
        row = RowCycle(self, request, stats, self._sources_for(request), self._cycles_unpriced)
        row.sources.reset()
        prompt_logits = self._prefill(request, stats, row.harvest_rows())
        yield request.tokens[-1:].tolist()  # the first token goes out before the sources read the prompt
        row.begin(prompt_logits)
        while request.stop_reason is None:
            room = verifier.max_positions - 1 - verifier.past_length
            if room <= 0:
                break
            row.draft(room, budget_planner)  # 1. every source drafts; the pool ranks them
            budget = row.budget(budget_planner) if self.config.budget == "auto" else self.config.fixed_budget()
            tree = row.plan(min(budget, room))  # 2. the topology plans the tree
            verify_started = time.perf_counter()  # 3. one pass over the tree and any auxiliary rows
            logits = verifier.verify(tree, row.auxiliary_rows)
            verify_s = time.perf_counter() - verify_started
            row.clock.lap("verify")
            path, kept = row.conclude(logits, verifier.past_length)  # 4-5. walk, then every source learns
            verifier.commit(path)
            row.learned(budget_planner, verify_s)
            yield kept

    def source_names(self, with_prediction: bool) -> tuple[str, ...]:
        """The sources a request drafts from: the decoder's, with the prediction source in front for a request
        that carries a prediction (unless the decoder's own sources already include it)."""
        if with_prediction and "prediction" not in self.sources.names:
            return ("prediction", *self.sources.names)
        return self.sources.names

    def _sources_for(self, request: _Request) -> SourceSet:
        """The set behind :meth:`source_names` for this request.

        The set with the prediction source is made once, on the first request with a prediction, and shares
        every other source's instance and acceptance estimate with the decoder's own set, so what they learn
        carries over.
        """
        names = self.source_names(request.prediction is not None)
        if names == self.sources.names:
            return self.sources
        if self._predicting is None:
            self._predicting = SourceSet(names, self.config, self.verifier.vocab_size,
                                         faults=self.sources.faults, estimates=self.sources.estimates,
                                         instances=self.sources.instances)
        return self._predicting

    def _row_draws(self, sampler: Sampler, logits: torch.Tensor, tree: DraftTree, past: int) -> Callable[[int], int]:
        """The target's token at a tree node's row (the row at depth d predicts position past + 1 + d).

        Off the CPU every tree row is warped and drawn in one batch and read back once, so the walk
        waits on the device once, not once per drawn token; on the CPU a read costs nothing and each
        row off the path would cost a softmax over the vocabulary, so only the walked rows are drawn.
        Either way a row's token is the one the seeded autoregressive sampler draws there.
        """
        if not self.draw_all_rows and logits.device.type == "cpu":
            return lambda node: sampler.draw(logits[node], past + 1 + int(tree.depths[node]))
        drawn = sampler.draw_rows(logits[: tree.size], (past + 1 + tree.depths).tolist()).cpu().numpy()
        return lambda node: int(drawn[node])


class RowCycle:
    """One request's side of the Goose cycle: its sources draft, its topology plans, it walks and learns.

    The verify pass between :meth:`plan` and :meth:`conclude` is the caller's: the single-request loop
    (:meth:`GooseDecoder._cycles`) runs one tree through its :class:`Verifier`, the batched engine
    (:mod:`goose.cycle.batch`) the trees of every row in one pass; the rest of the cycle is this, for both.
    """

    def __init__(self, decoder: GooseDecoder, request: _Request, stats: GenerationStats, sources: SourceSet,
                 unpriced: dict[str, int] | None = None) -> None:
        self.decoder, self.request, self.stats, self.sources = decoder, request, stats, sources
        self.unpriced = unpriced if unpriced is not None else {}  # per source: cycles since its rows last rode
        self.clock = _PhaseClock(stats if decoder.profile else None)
        self.pool: CandidatePool | None = None
        self.auxiliary: list[tuple[str, AuxiliaryRows]] = []
        self.tree: DraftTree | None = None
        self.masks: np.ndarray | None = None  # a constrained request's grammar bitmask of every tree row
        self.started = 0.0

    def harvest_rows(self) -> int:
        """Prompt rows whose logits the prefill keeps for the sources (``GooseConfig.prefill_harvest``)."""
        return harvest_rows(self.decoder.config.prefill_harvest, len(self.request.prompt_ids),
                            self.decoder._output_row_weight)

    def begin(self, prompt_logits: torch.Tensor) -> None:
        """The sources read the prompt and the top-k of its harvested rows (``prompt_logits`` [h + 1, V])."""
        if self.request.stop_reason is None:
            self.sources.prefill(self.context(), _prompt_harvest(self.request.prompt_ids, prompt_logits[:-1],
                                                                 self.decoder.config.harvest_top_k))

    @property
    def auxiliary_rows(self) -> list[AuxiliaryRows]:
        return [rows for _, rows in self.auxiliary]

    @property
    def riding(self) -> int:
        """Auxiliary rows riding in this cycle's pass."""
        return sum(int(rows.tokens.shape[0]) for _, rows in self.auxiliary)

    def draft(self, room: int, planner: BudgetPlanner | None) -> None:
        """1. Every source drafts; the pool ranks them by acceptance; auxiliary rows that fit the pass's
        ``room`` and pay may ride."""
        self.started = time.perf_counter()
        self.pool, offered = self.sources.propose(self.context())
        self.auxiliary = self._rows_that_pay(_fitting(offered, room), planner)
        self.clock.lap("draft")

    def budget(self, planner: BudgetPlanner | None) -> int:
        """This row's budget by itself: the cost curve's best for its pool (``budget="auto"``)."""
        assert self.pool is not None and planner is not None
        return planner.budget(self.pool, self.decoder.topology.spine_lengths, self.riding)

    def plan(self, budget: int) -> DraftTree:
        """2. The topology turns the pool into a draft tree of at most ``budget`` draft nodes (of a constrained
        request: without the drafted tokens its grammar forbids)."""
        assert self.pool is not None
        return self._planned(self.decoder.topology.plan(self.pool, budget))

    def plan_nothing(self) -> DraftTree:
        """2, undrafted: the bare anchor (a batched pass where this row's draft does not pay for its rows)."""
        assert self.pool is not None
        return self._planned(DraftTree.single(self.pool.anchor, self.pool.source_names))

    def _planned(self, tree: DraftTree) -> DraftTree:
        constraint = self.request.constraint
        if constraint is not None:  # between the plan and the pass: the grammar cuts and masks the tree
            tree, self.masks = constraint.plan(tree)
        self.tree = tree
        self.clock.lap("plan")
        return tree

    def conclude(self, logits: torch.Tensor, past: int) -> tuple[np.ndarray, list[int]]:
        """4-5. Walk the verified rows ``logits`` (tree rows, then auxiliary rows; the anchor at position
        ``past``), keep the tokens, let every source learn. Returns (the accepted path, the tokens kept);
        the caller commits the path to its cache."""
        tree, pool, request, config = self.tree, self.pool, self.request, self.decoder.config
        assert tree is not None and pool is not None
        if request.constraint is not None:
            assert self.masks is not None
            request.constraint.apply(logits, self.masks)
        readout = read(logits, tree.size, config.harvest_top_k)
        # 4. walk: the longest path the target agrees with, then the bonus token
        if request.sampler is None:
            walked = walk(tree, readout.predictions[: tree.size])
        else:
            walked = walk_sampled(tree, self.decoder._row_draws(request.sampler, logits, tree, past))
        # the anchor's row predicted the first kept token, each accepted node's row the next (the bonus last)
        kept = request.accept_scored(walked.tokens, logits, [ROOT, *walked.path.tolist()])
        self.clock.lap("walk+commit")
        # 5. every source learns from the outcome; the boundary updates their acceptance estimates
        outcome = VerifyOutcome(
            tree=tree, accepted_nodes=walked.path, new_tokens=kept, bonus_token=walked.bonus_token,
            reached=walked.reached, accepted=walked.accepted, path_kind=walked.kind,
            harvest=Harvest.of_tree(tree, pool.previous, readout.top_tokens, readout.top_scores),
        )
        counts = self.sources.observe(outcome, _split_auxiliary(self.auxiliary, readout.predictions[tree.size :]))
        self.stats.record_step(len(kept), tree.size, walked.kind, counts, self.riding)
        self.clock.lap("observe")
        return walked.path, kept

    def learned(self, planner: BudgetPlanner | None, verify_s: float) -> None:
        """The planner folds in this cycle's host time (all but the pass's ``verify_s``) and yield."""
        if planner is not None and self.tree is not None:
            planner.observe_overhead(time.perf_counter() - self.started - verify_s)
            planner.observe_verify(self.tree.size + self.riding, verify_s)
            planner.observe_cycle(self.tree.size, self.stats.accepted_lengths[-1])

    def context(self) -> DecodeContext:
        request = self.request
        return DecodeContext(tokens=request.tokens, prompt_length=len(request.prompt_ids),
                             vocab_size=self.decoder.verifier.vocab_size, eos_token_ids=request.eos_ids,
                             tokenizer=self.decoder.tokenizer, prediction=request.prediction)

    def _rows_that_pay(self, auxiliary: list[tuple[str, AuxiliaryRows]],
                       planner: BudgetPlanner | None) -> list[tuple[str, AuxiliaryRows]]:
        """The auxiliary rows worth their time this cycle by the cost curve (``GooseConfig.price_rows``).

        A source's rows are valued by the tokens it contributes a cycle; rows that do not pay still
        ride once every ``probe_every`` cycles, so the contribution keeps being measured.
        """
        config = self.decoder.config
        if planner is None or not config.price_rows:
            return auxiliary
        riding, kept = 0, []
        for name, rows in auxiliary:
            count = int(rows.tokens.shape[0])
            waited = self.unpriced.get(name, 0) + 1
            contribution = self.sources.estimates[name].contribution
            if planner.rows_pay(count, contribution, riding) or waited >= config.probe_every:
                kept.append((name, rows))
                riding += count
                waited = 0
            self.unpriced[name] = waited
        return kept


def _prompt_harvest(prompt_ids: list[int], logits: torch.Tensor, k: int) -> Harvest:
    """Top-k at the last ``len(logits)`` prompt positions, read in one pass and one device read."""
    _, top_tokens, top_logits = greedy_and_top_k(logits, k)
    top_scores = torch.softmax(top_logits.float(), dim=-1)
    return Harvest.of_prompt(prompt_ids, top_tokens.cpu().numpy(), top_scores.cpu().numpy())


def _fitting(auxiliary: list[tuple[str, AuxiliaryRows]], room: int) -> list[tuple[str, AuxiliaryRows]]:
    """The auxiliary rows that fit a pass of ``room`` positions after the anchor, in order: rows that would sit
    past the model's last position cannot ride, nor more rows than the pass has room for (a batch's slot holds
    every row of its pass)."""
    fitting, rows = [], 0
    for name, offered in auxiliary:
        count = int(offered.tokens.shape[0])
        if rows + count <= room and (count == 0 or int(offered.position_offsets.max()) <= room):
            fitting.append((name, offered))
            rows += count
    return fitting


def _split_auxiliary(auxiliary: list[tuple[str, Any]], predictions: np.ndarray) -> dict[str, np.ndarray]:
    """Per source, its slice of the auxiliary rows' predictions (in pass order)."""
    split, start = {}, 0
    for name, rows in auxiliary:
        count = int(rows.tokens.shape[0])
        split[name] = predictions[start : start + count]
        start += count
    return split


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> frozenset[int]:
    ids: set[int] = set()
    for value in (getattr(model.generation_config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return frozenset(ids)


class _PhaseClock:
    """Accumulates seconds per cycle phase into ``stats.profile`` (no-op unless profiling)."""

    def __init__(self, stats: GenerationStats | None) -> None:
        self.stats = stats
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        if self.stats is not None:
            now = time.perf_counter()
            self.stats.profile[phase] += now - self.last
            self.last = now


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
    overrides = {key: value for key, value in (("sources", sources), ("topology", topology), ("budget", budget))
                 if value is not None}
    config = GooseConfig.model_validate({**(config or GooseConfig()).model_dump(), **overrides})
    return GooseDecoder(model, tokenizer, config, chat=chat).generate(prompt, max_new_tokens, **options)


def autoregressive(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, prompt: Prompt, max_new_tokens: int = 128,
    *, chat: bool = True, **options: Any,
) -> GenerationResult:
    """Plain decoding through the same plumbing (greedy, or the seeded sampler): the baseline Goose must reproduce."""
    return AutoregressiveDecoder(model, tokenizer, chat).generate(prompt, max_new_tokens, **options)
