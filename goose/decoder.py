"""The Goose cycle, top to bottom, and the autoregressive loop it must reproduce.

One cycle: every source proposes -> the topology plans a draft tree -> the verifier runs the
tree through the target in one pass -> the walker takes the longest agreed path plus the bonus
token -> every source observes the outcome (accepted path, each node's fate, top-k of every
verified row). The output is token-for-token the target's greedy decoding; sources and
topologies only change how many tokens each forward pass yields.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from goose.budget import BudgetPlanner
from goose.candidates import (
    CandidateError,
    CandidatePool,
    DecodeContext,
    Draft,
    SourceCandidates,
    SuccessorFn,
    chain_rate,
)
from goose.config import GooseConfig
from goose.cost import CostCurve, load_or_measure
from goose.outcome import AuxiliaryRows, Harvest, VerifyOutcome
from goose.plugins import PluginError, SourceSet, make_topology
from goose.readout import greedy, greedy_and_top_k
from goose.sampling import SamplingParams
from goose.stats import GenerationStats
from goose.tree import DraftTree
from goose.verifier import ContextOverflowError, Verifier
from goose.walker import walk

Prompt = str | list[int] | torch.Tensor


@dataclass
class GenerationResult:
    """What a generation returns: the new tokens, their text, why it stopped, and its statistics."""

    prompt_ids: list[int]
    new_token_ids: list[int]
    text: str
    stop_reason: str  # "eos", "max_new_tokens" or "context_full"
    stats: GenerationStats

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "new_token_ids": self.new_token_ids, "stop_reason": self.stop_reason,
                **self.stats.to_dict()}


@dataclass(frozen=True)
class Chunk:
    """One streamed piece: the tokens a cycle appended and the text they complete."""

    token_ids: list[int]
    text: str


@dataclass
class _Request:
    """Per-request state: the token buffer (prompt, then output) and the stopping rule."""

    prompt_ids: list[int]
    max_new_tokens: int
    eos_ids: frozenset[int]
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

    def accept(self, tokens: list[int]) -> list[int]:
        """Append tokens up to the limit and through the first EOS; returns what was appended."""
        kept = tokens[: self.max_new_tokens - self.produced]
        for i, token in enumerate(kept):
            if token in self.eos_ids:
                kept = kept[: i + 1]
                self.stop_reason = "eos"
                break
        self.buffer[self.length : self.length + len(kept)] = kept
        self.length += len(kept)
        if self.stop_reason is None and self.produced >= self.max_new_tokens:
            self.stop_reason = "max_new_tokens"
        return kept


class _Decoding:
    """What the Goose decoder and the autoregressive loop share: prompt handling, stopping, results."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, chat: bool = True) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.chat = chat
        self.verifier = Verifier(model)
        self.eos_ids = _eos_ids(model, tokenizer)
        self.last_result: GenerationResult | None = None

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of ``prompt``: a string goes through the chat template when the model has one."""
        from goose.models import encode_prompt

        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("empty prompt: give some text to continue")
            return encode_prompt(self.tokenizer, prompt, chat=self.chat)
        ids = prompt.flatten().tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
        if not ids:
            raise ValueError("empty prompt: give at least one token id")
        if any(not isinstance(t, int) or t < 0 or t >= self.verifier.vocab_size for t in ids):
            raise ValueError(f"prompt token ids must be ints in [0, {self.verifier.vocab_size})")
        return ids

    def _request(self, prompt: Prompt, max_new_tokens: int, options: dict[str, Any]) -> _Request:
        if max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
        eos_token_ids = options.pop("eos_token_ids", None)
        sampling = SamplingParams.model_validate({k: v for k, v in options.items() if v is not None})
        if not sampling.greedy:
            raise ValueError("sampling (temperature > 0) is not available yet; use temperature 0")
        ids = self.encode(prompt)
        if len(ids) >= self.verifier.max_positions:
            raise ContextOverflowError(
                f"prompt of {len(ids)} tokens does not fit the model's context of {self.verifier.max_positions}"
            )
        eos = self.eos_ids if eos_token_ids is None else frozenset(int(t) for t in eos_token_ids)
        return _Request(ids, max_new_tokens, eos)

    def stream(self, prompt: Prompt, max_new_tokens: int = 128, **options: Any) -> Iterator[Chunk]:
        """Yield the output as it is accepted; ``last_result`` holds the full result afterwards.

        ``options``: ``temperature``, ``top_p``, ``top_k``, ``seed`` (see :class:`SamplingParams`) and
        ``eos_token_ids`` (the tokens that end the output; default: the model's and tokenizer's EOS).
        """
        request = self._request(prompt, max_new_tokens, dict(options))
        stats = GenerationStats()
        started = time.perf_counter()
        text = ""
        for token_ids in self._cycles(request, stats):
            stats.new_tokens = request.produced
            stats.wall_s = time.perf_counter() - started
            full = self.tokenizer.decode(request.tokens[len(request.prompt_ids) :].tolist(),
                                         skip_special_tokens=True)
            paused = time.perf_counter()
            yield Chunk(token_ids, full[len(text) :])
            started += time.perf_counter() - paused  # time spent in the consumer is not decoding time
            text = full
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
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        return GenerationResult(request.prompt_ids, new_ids, text, request.stop_reason or "context_full", stats)

    def _prefill(self, request: _Request, stats: GenerationStats, harvest_rows: int) -> torch.Tensor:
        started = time.perf_counter()
        logits = self.verifier.prefill(request.prompt_ids, logits_to_keep=harvest_rows + 1)
        request.accept([int(greedy(logits[-1:])[0])])
        stats.prefill_s = time.perf_counter() - started
        return logits

    def _cycles(self, request: _Request, stats: GenerationStats) -> Iterator[list[int]]:
        raise NotImplementedError


class AutoregressiveDecoder(_Decoding):
    """Plain greedy decoding, one token per forward, through the same verifier plumbing as Goose."""

    def _cycles(self, request: _Request, stats: GenerationStats) -> Iterator[list[int]]:
        self._prefill(request, stats, harvest_rows=0)
        yield request.tokens[-1:].tolist()
        while request.stop_reason is None and self.verifier.past_length + 1 < self.verifier.max_positions:
            tree = DraftTree.single(int(request.tokens[-1]))
            logits = self.verifier.verify(tree)
            self.verifier.commit(tree.tokens[:0])
            kept = request.accept([int(greedy(logits[:1])[0])])
            stats.verify_steps += 1
            stats.accepted_lengths.append(len(kept))
            yield kept


class GooseDecoder(_Decoding):
    """Goose speculative decoding: multi-source candidates, a planned draft tree, one verify pass per cycle.

    Sources and the topology are instantiated once per decoder (their state, such as a
    persistent adjacency table, lives as long as the decoder). With ``budget="auto"`` the budget
    follows this device's measured cost curve, or ``cost_curve`` when given (to plan, say, a
    float32 run as if it ran on a bfloat16 curve).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        config: GooseConfig | None = None,
        *,
        chat: bool = True,
        profile: bool = False,
        cost_curve: CostCurve | None = None,
        **overrides: Any,
    ) -> None:
        super().__init__(model, tokenizer, chat)
        base = config or GooseConfig()
        self.config = GooseConfig.model_validate({**base.model_dump(), **overrides}) if overrides else base
        if not self.config.sources:
            raise PluginError("no sources enabled: name at least one with --sources")
        self.sources = SourceSet(self.config.sources, self.config)
        self.planner = make_topology(self.config.topology, self.config)
        self.profile = profile
        if self.config.budget == "auto":  # ``cost_curve``: plan for another device's curve (e.g. a bf16 one)
            curve = cost_curve if cost_curve is not None else load_or_measure(model)
            self.budget_planner: BudgetPlanner | None = BudgetPlanner(curve, max_depth=self.config.max_depth)
        else:
            self.budget_planner = None
        self._successors = {name: self._checked_successors(name) for name in self.sources.names
                            if self.sources.implements(name, "goose_successors")}

    def _cycles(self, request: _Request, stats: GenerationStats) -> Iterator[list[int]]:
        config, sources = self.config, self.sources
        harvest_rows = len(request.prompt_ids) if config.prefill_harvest is None else config.prefill_harvest
        sources.call("goose_reset")
        prompt_logits = self._prefill(request, stats, harvest_rows=min(harvest_rows, len(request.prompt_ids) - 1))
        sources.call("goose_prefill", context=self._context(request),
                     harvest=_prefill_harvest(request.prompt_ids, prompt_logits[:-1], config.harvest_top_k))
        yield request.tokens[-1:].tolist()
        clock = _PhaseClock(stats if self.profile else None)

        while request.stop_reason is None:
            room = self.verifier.max_positions - 1 - self.verifier.past_length
            if room <= 0:
                break
            cycle_started = time.perf_counter()
            # 1. candidates: every source drafts and reports how far it is trusted
            context = self._context(request)
            pool, auxiliary = self._candidate_pool(context)
            # auxiliary rows that would sit past the model's last position cannot ride this pass
            auxiliary = [(name, rows) for name, rows in auxiliary
                         if rows.tokens.numel() == 0 or int(rows.position_offsets.max()) <= room]
            clock.lap("draft")
            # 2. topology: the candidate pool becomes a draft tree within the budget
            tree = self._plan(pool, min(self._budget(pool), room))
            clock.lap("plan")
            # 3. one verification pass over the whole tree (and any auxiliary rows)
            verify_started = time.perf_counter()
            logits = self.verifier.verify(tree, [rows for _, rows in auxiliary])
            # the walk's argmax and the harvest's top-k of the tree rows come from one read of the logits
            tree_predictions, top_tokens, top_logits = greedy_and_top_k(logits[: tree.size], config.harvest_top_k)
            if auxiliary:
                tree_predictions = torch.cat([tree_predictions, greedy(logits[tree.size :])])
            predictions = tree_predictions.cpu()
            verify_s = time.perf_counter() - verify_started
            clock.lap("verify")
            # 4. walk: longest path the target agrees with, then the bonus token
            walked = walk(tree, predictions[: tree.size])
            self.verifier.commit(walked.path)
            kept = request.accept(walked.tokens)
            clock.lap("walk+commit")
            # 5. every source learns from the outcome (harvest of all verified rows)
            outcome = VerifyOutcome(
                tree=tree, accepted_nodes=walked.path, new_tokens=kept, bonus_token=walked.bonus_token,
                reached=walked.reached, accepted=walked.accepted, path_kind=walked.kind,
                harvest=_tree_harvest(tree, pool.previous, top_tokens, top_logits),
                auxiliary=_split_auxiliary(auxiliary, logits[tree.size :]),
                auxiliary_predictions=_split_auxiliary(auxiliary, predictions[tree.size :]),
            )
            sources.call("goose_observe", outcome=outcome)
            stats.record_step(len(kept), tree.size, walked.kind,
                              {name: outcome.source_counts(i) for i, name in enumerate(sources.names)})
            clock.lap("observe")
            if self.budget_planner is not None:
                self.budget_planner.observe_overhead(time.perf_counter() - cycle_started - verify_s)
            yield kept

    def _context(self, request: _Request) -> DecodeContext:
        return DecodeContext(tokens=request.tokens, prompt_length=len(request.prompt_ids),
                             vocab_size=self.verifier.vocab_size, eos_token_ids=self.eos_ids, config=self.config,
                             tokenizer=self.tokenizer)

    def _candidate_pool(self, context: DecodeContext) -> tuple[CandidatePool, list[tuple[str, AuxiliaryRows]]]:
        vocab = self.verifier.vocab_size
        drafts = self.sources.call("goose_propose", context=context)
        estimates = self.sources.call("goose_acceptance")  # after proposing: it may describe this cycle's draft
        auxiliary: list[tuple[str, AuxiliaryRows]] = []
        for name, rows in self.sources.call("goose_auxiliary_rows", context=context).items():
            if rows is None:
                continue
            try:
                auxiliary.append((name, rows.validate(vocab)))
            except (ValueError, AttributeError) as error:
                self.sources.warn_once(name, "goose_auxiliary_rows", str(error))
        candidates = []
        for source_id, name in enumerate(self.sources.names):
            draft = self._checked_draft(name, drafts.get(name), vocab)
            by_depth = _estimates(estimates.get(name))
            candidates.append(SourceCandidates(
                name=name, source_id=source_id, draft=draft, successors=self._successors.get(name),
                acceptance=by_depth[0] if len(by_depth) == 1 else chain_rate(by_depth, len(draft) if draft else 1),
                depth_acceptance=by_depth if len(by_depth) > 1 else (),
            ))
        candidates.sort(key=lambda c: -c.acceptance)  # stable: ties keep the configured order
        return CandidatePool(anchor=context.anchor, previous=context.previous, source_names=self.sources.names,
                             candidates=tuple(candidates)), auxiliary

    def _checked_draft(self, name: str, draft: object, vocab: int) -> Draft | None:
        if draft is None:
            return None
        try:
            if not isinstance(draft, Draft):
                raise CandidateError(f"goose_propose returned {type(draft).__name__}, not a Draft")
            return draft.validate(vocab)
        except CandidateError as error:
            self.sources.warn_once(name, "goose_propose", str(error))
            return None

    def _checked_successors(self, name: str) -> SuccessorFn:
        vocab = self.verifier.vocab_size

        def successors(previous: torch.Tensor, tokens: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
            empty = (torch.full((tokens.shape[0], 0), -1, dtype=torch.long), torch.zeros(tokens.shape[0], 0))
            answer = self.sources.call_one(name, "goose_successors", previous=previous, tokens=tokens, k=k)
            if answer is None:
                return empty
            try:
                next_tokens, scores = (torch.as_tensor(a) for a in answer)
                m = tokens.shape[0]
                if next_tokens.ndim != 2 or next_tokens.shape[0] != m or scores.shape != next_tokens.shape:
                    raise CandidateError(f"successor shapes {tuple(next_tokens.shape)} / {tuple(scores.shape)} "
                                         f"do not fit {m} queries")
                if next_tokens.numel() and (int(next_tokens.max()) >= vocab or int(next_tokens.min()) < -1):
                    raise CandidateError(f"successor token ids outside the vocabulary [0, {vocab})")
                return next_tokens[:, :k].long(), scores[:, :k].float()
            except (CandidateError, TypeError, ValueError) as error:
                self.sources.warn_once(name, "goose_successors", str(error))
                return empty

        return successors

    def _plan(self, pool: CandidatePool, budget: int) -> DraftTree:
        try:
            tree = self.planner.goose_plan_tree(pool=pool, budget=budget, config=self.config)
            return _checked_tree(tree, pool, budget, self.verifier.vocab_size)
        except Exception as error:  # a faulty planner costs speed for a cycle, never correctness
            self.sources.warn_once(self.config.topology, "goose_plan_tree", f"{type(error).__name__}: {error}")
            return DraftTree.single(pool.anchor, pool.source_names)

    def _budget(self, pool: CandidatePool) -> int:
        """The configured budget, or with ``budget="auto"`` the one the cost model expects to be fastest."""
        if self.budget_planner is None:
            return int(self.config.budget)
        spine = pool.drafting[0] if pool.drafting else None
        branch = pool.branching[0] if pool.branching else None
        return self.budget_planner.choose(
            (spine.depth_acceptance or spine.acceptance) if spine else 0.0,
            len(spine.draft) if spine and spine.draft is not None else 0,
            branch.acceptance if branch else 0.0,
            self._spine_caps(pool) if spine else None,
        )

    def _spine_caps(self, pool: CandidatePool) -> tuple[int, ...] | None:
        """The topology's spine length for every candidate budget (``goose_spine_lengths``), if it says."""
        candidates = self.budget_planner.candidates
        try:
            caps = self.planner.goose_spine_lengths(pool=pool, budgets=candidates, config=self.config)
            if caps is None:
                return None
            caps = tuple(int(cap) for cap in caps)
            if len(caps) != len(candidates) or min(caps, default=0) < 0:
                raise CandidateError(f"{len(caps)} spine lengths for {len(candidates)} budgets, or a negative one")
            return caps
        except Exception as error:  # a faulty hint costs the planner's accuracy, never correctness
            self.sources.warn_once(self.config.topology, "goose_spine_lengths", f"{type(error).__name__}: {error}")
            return None


def _checked_tree(tree: object, pool: CandidatePool, budget: int, vocab: int) -> DraftTree:
    if not isinstance(tree, DraftTree):
        raise CandidateError(f"planner returned {type(tree).__name__}, not a DraftTree")
    n = tree.size
    if n > budget + 1 or int(tree.tokens[0]) != pool.anchor or int(tree.parents[0]) != -1:
        raise CandidateError("tree exceeds its budget or is not rooted at the anchor")
    if n > 1:
        parents = tree.parents[1:]
        if not bool(((parents >= 0) & (parents < torch.arange(1, n))).all()):
            raise CandidateError("tree parents must precede their children")
        if int(tree.tokens.min()) < 0 or int(tree.tokens.max()) >= vocab:
            raise CandidateError("tree token ids outside the vocabulary")
        if torch.unique(tree.parents * vocab + tree.tokens).numel() != n:
            raise CandidateError("tree has duplicate (parent, token) nodes")
        if not bool((tree.depths[1:] == tree.depths[parents] + 1).all()):
            raise CandidateError("tree depths disagree with its parents")
    return tree


def _harvest(previous: torch.Tensor, tokens: torch.Tensor, top_tokens: torch.Tensor,
             top_logits: torch.Tensor) -> Harvest:
    return Harvest(previous=previous, tokens=tokens, top_tokens=top_tokens.cpu(),
                   top_scores=torch.softmax(top_logits.float(), dim=-1).cpu())


def _prefill_harvest(prompt_ids: list[int], logits: torch.Tensor, k: int) -> Harvest:
    """Top-k at the last ``len(logits)`` prompt positions (the final position's row went to the first token)."""
    rows = logits.shape[0]
    ids = torch.tensor(prompt_ids, dtype=torch.long)
    end = ids.shape[0] - 1
    tokens = ids[end - rows : end]
    previous = ids[max(0, end - rows - 1) : end - 1]
    if previous.shape[0] < rows:
        previous = torch.cat([torch.full((rows - previous.shape[0],), -1, dtype=torch.long), previous])
    _, top_tokens, top_logits = greedy_and_top_k(logits, k)
    return _harvest(previous, tokens, top_tokens, top_logits)


def _tree_harvest(tree: DraftTree, anchor_previous: int, top_tokens: torch.Tensor,
                  top_logits: torch.Tensor) -> Harvest:
    parent_tokens = tree.tokens[tree.parents.clamp(min=0)]
    previous = torch.where(tree.parents >= 0, parent_tokens, torch.full_like(parent_tokens, anchor_previous))
    return _harvest(previous, tree.tokens, top_tokens, top_logits)


def _split_auxiliary(auxiliary: list[tuple[str, AuxiliaryRows]], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per source, its slice of ``rows`` (logits or predictions of the auxiliary rows, in pass order)."""
    split, start = {}, 0
    for name, added in auxiliary:
        count = int(added.tokens.shape[0])
        split[name] = rows[start : start + count]
        start += count
    return split


def _clamp_estimate(value: object) -> float:
    try:
        estimate = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return min(1.0, max(0.0, estimate)) if estimate == estimate else 0.0


def _estimates(value: object) -> tuple[float, ...]:
    """A source's acceptance report as per-depth estimates in [0, 1]: a number is one depth, garbage 0."""
    if isinstance(value, list | tuple | np.ndarray) and np.ndim(value) == 1 and len(value):
        return tuple(_clamp_estimate(v) for v in value)
    return (_clamp_estimate(value),)


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids: set[int] = set()
    for value in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
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
    tokenizer: PreTrainedTokenizerBase,
    prompt: Prompt,
    max_new_tokens: int = 128,
    *,
    sources: list[str] | None = None,
    topology: str | None = None,
    budget: int | str | None = None,
    config: GooseConfig | None = None,
    chat: bool = True,
) -> GenerationResult:
    """Generate greedily with Goose: token-identical to plain greedy decoding, in fewer forward passes."""
    overrides = {key: value for key, value in (("sources", sources), ("topology", topology), ("budget", budget))
                 if value is not None}
    config = GooseConfig.model_validate({**(config or GooseConfig()).model_dump(), **overrides})
    return GooseDecoder(model, tokenizer, config, chat=chat).generate(prompt, max_new_tokens)


def autoregressive(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt: Prompt, max_new_tokens: int = 128,
    *, chat: bool = True,
) -> GenerationResult:
    """Plain greedy decoding through the same plumbing: the baseline Goose must reproduce."""
    return AutoregressiveDecoder(model, tokenizer, chat).generate(prompt, max_new_tokens)
