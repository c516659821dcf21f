"""Goose inside vLLM: a ``custom_class`` speculative proposer that drafts from Goose's sources.

vLLM (0.32) lets a third-party class draft tokens for its own speculative decoding::

    LLM(model=path, speculative_config={"method": "custom_class", "model": "goose_vllm.GooseProposer",
                                        "num_speculative_tokens": 16})

vLLM builds the class as ``GooseProposer(vllm_config)``, calls ``load_model(model)`` once and then,
after every engine step, ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, ...)``
with one entry per row of the running batch; it verifies the drafts with the target (greedy or
rejection sampling), so the output is exactly what vLLM produces without speculation. This module
is the proposer and nothing else: vLLM is imported by no line here. It is goose-vllm, a distribution of its
own beside goose-decoding (vLLM's environment pins its own transformers): it reaches Goose through Goose's
public API only (integrations/vllm/tests/test_public_api.py), and ``import goose`` never needs it.

Three parts, each replaceable on its own:

* :class:`RowDrafter` is the only code that talks to Goose's source contract: it turns one
  request's tokens into a context, asks the sources (through :mod:`goose.boundary`, which contains
  their faults) for drafts, picks the most valuable chain and its length, and feeds back how many
  drafted tokens vLLM accepted as the walk of a chain tree (:mod:`goose.cycle.walker`, the engine's own), so
  that the sources' estimates learn exactly as they do in Goose's own decoder.
* :class:`RequestTable` knows which drafter serves which request although vLLM passes no request
  id and reorders rows between steps: a request is known by its content. A row that holds tokens
  ``t[:n]`` after ``s`` newly sampled ones continues the request whose tokens were ``t[:n - s]`` at
  the previous step, so a hash of that prefix finds it (no walk through vLLM's private objects).
  A drafter whose request is gone serves the next new request, so what outlives a request in Goose
  (copy-depth estimates) carries over here too; the drafters' suffix memories share one archive of
  earlier requests (``share_memory``), so every request drafts from every finished one.
* :class:`GooseProposer` is the vLLM glue: configuration, the per-step loop over rows, the
  engine's step cost measured from its own calls (:class:`StepCost`, which sets each chain's
  length through :class:`ChainCut`), and the guarantee that nothing here can change vLLM's output
  or take the engine down (a fault costs that row its draft, with one log line).

Configuration is :class:`ProposerConfig`, read from the environment variable ``GOOSE_VLLM_CONFIG``
(a JSON object, or the path of a JSON file), or from a subclass's ``config`` attribute. vLLM's
speculative config has no free field to carry it (its dataclass forbids extra keys).
"""

from __future__ import annotations

import importlib
import itertools
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from goose import plugins
from goose.boundary import FaultLog, Guarded, SourceSet, made
from goose.config import GooseConfig
from goose.contract.candidates import DecodeContext, eos_token_ids
from goose.contract.outcome import Harvest
from goose.contract.tree import ROOT, DraftTree, TreeBuilder
from goose.cycle.walker import walk

logger = logging.getLogger("goose_vllm")

CONFIG_ENV = "GOOSE_VLLM_CONFIG"
COLD_START_THRESHOLD = 0.1  # the chain cut's path probability until the step cost has been measured
_PROPOSERS = itertools.count()  # numbers the proposers of a process: each shares one suffix memory among its drafters


class ProposerConfig(BaseModel):
    """What the Goose proposer drafts with inside vLLM (``GOOSE_VLLM_CONFIG``).

    ``sources``, ``source_options``, ``initial_acceptance`` and ``ema`` mean what they mean in
    :class:`goose.config.GooseConfig`. The number of draft tokens (K) is vLLM's
    ``num_speculative_tokens``; the topology is always a chain, because vLLM verifies chains.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    sources: list[str] = Field(
        default_factory=lambda: ["context_match", "suffix_memory"],
        description="Goose sources that draft, most trusted first. Sources that need the target's logits "
        "(bigram_transition) or extra verify rows (lookahead) cannot work through vLLM's custom_class door "
        "and are skipped with a warning that says why. The suffix memory drafts what followed the context's "
        "suffix in the engine's earlier requests (with share_memory, every request the engine finished)",
    )
    source_options: dict[str, dict[str, Any]] = Field(
        default_factory=lambda: {
            "context_match": {"ngram_sizes": [12, 8, 6, 5, 4, 3, 2, 1], "consensus_score": 0.0},
            "suffix_memory": {"ngram_sizes": [32, 24, 16, 12, 8, 6, 4, 3, 2, 1], "search_current": False,
                              "lead_in": 64},
        },
        description="per-source options. Context match copies after a match of any length down to one token "
        "(Goose's own default stops at 3): inside vLLM a chain is as long as its estimated acceptance pays for "
        "under the measured step cost, so a weak match drafts a token or two instead of nothing; and its "
        "consensus floor is off, because a 1- and a 2-token match agree on most copies without making them "
        "likelier (with the floor, tokens scored 0.3 were accepted 0.19 of the time; without it the scores are "
        "calibrated). The suffix memory searches earlier requests only, since context match covers the current "
        "one, and keeps 64 prompt tokens before each remembered output. A value given replaces this whole default",
    )
    initial_acceptance: dict[str, float] = Field(
        default_factory=dict, description="per source: acceptance estimate before any verification")
    ema: float = Field(default=0.3, gt=0.0, le=1.0, description="EMA coefficient of the acceptance estimates")
    plugins: list[str] = Field(
        default_factory=list,
        description="modules to register as Goose plugins in the engine process before the sources are made "
        "(a source that is not packaged with a `goose` entry point)",
    )
    min_path_probability: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="None (default): each chain is as long as maximises its expected tokens per second under the "
        "engine's measured step cost (see StepCost). A number: cut every chain before the first token whose chance "
        "of being accepted together with all before it is below this number (0: always all K tokens)",
    )
    share_memory: bool = Field(
        default=True,
        description="the drafters (one per running request) share one suffix memory of earlier requests, so a "
        "request drafts from every request the engine finished, not only from those its own drafter served "
        "(sets the suffix memory's `share` option to a name of this proposer's own)",
    )
    max_requests: int | None = Field(
        default=None, ge=1,
        description="requests whose drafting state is remembered (oldest forgotten first); default: four "
        "times vLLM's max_num_seqs",
    )

    def goose_config(self, share: str | None = None) -> GooseConfig:
        """The drafters' GooseConfig; ``share``: the name their suffix memories share (with ``share_memory``)."""
        options = self.source_options
        if share is not None and self.share_memory and "suffix_memory" in self.sources:
            options = {**options, "suffix_memory": {**options.get("suffix_memory", {}), "share": share}}
        return GooseConfig(sources=self.sources, topology="chain", source_options=options,
                           initial_acceptance=self.initial_acceptance, ema=self.ema)

    @classmethod
    def from_environment(cls) -> ProposerConfig:
        """The configuration in ``$GOOSE_VLLM_CONFIG`` (JSON text or a JSON file's path); defaults when unset."""
        value = os.environ.get(CONFIG_ENV, "").strip()
        if not value:
            return cls()
        if value.startswith("{"):
            text, origin = value, f"${CONFIG_ENV}"
        else:
            path = Path(value).expanduser()
            if not path.is_file():
                raise ValueError(f"${CONFIG_ENV} is neither a JSON object nor an existing file: {value!r}")
            text, origin = path.read_text(), str(path)
        try:
            return cls.model_validate(json.loads(text))
        except (json.JSONDecodeError, ValidationError) as error:
            raise ValueError(f"invalid Goose proposer configuration in {origin}: {error}") from None


@dataclass(frozen=True)
class Chain:
    """A drafted chain waiting for vLLM's verdict: its tokens, the source that drafted them, its tree."""

    tokens: list[int]
    source_id: int
    tree: DraftTree


@dataclass(frozen=True)
class ChainCut:
    """How long a chain is worth verifying, given each token's chance of passing with all before it.

    A step that verifies a row costs ``row_seconds`` plus ``token_seconds`` per draft token (the
    row's share of the engine's measured step time, see :class:`StepCost`). The chain is cut where
    one more token would lower the row's expected tokens per second: token L + 1, passing with
    chance P, is kept while P * T(L) > token_seconds * E(L), with E(L) = 1 + the first L chances
    (the token vLLM adds itself counts) and T(L) the step's cost with L draft tokens. ``threshold``
    instead keeps tokens while their chance is at least that number.
    """

    row_seconds: float = 1.0
    token_seconds: float = 0.0
    threshold: float | None = None

    @classmethod
    def of_step(cls, fixed: float, per_token: float, rows: int) -> ChainCut:
        """The cut for one of ``rows`` rows of a step costing ``fixed + per_token * verified tokens`` seconds."""
        # a row's share: the fixed cost split over the rows, plus its own token, plus its draft tokens
        return cls(row_seconds=fixed / rows + per_token, token_seconds=per_token)

    def length(self, path_scores: np.ndarray) -> tuple[int, float]:
        """(tokens to keep, expected tokens per second of the row with them)."""
        count = path_scores.shape[0]
        if self.threshold is not None:
            unlikely = np.flatnonzero(path_scores < self.threshold)
        else:
            expected = 1.0 + np.concatenate([[0.0], np.cumsum(path_scores)[:-1]])  # E(L) before token L + 1
            cost = self.row_seconds + self.token_seconds * np.arange(count)  # T(L)
            unlikely = np.flatnonzero(path_scores * cost <= self.token_seconds * expected)
        keep = int(unlikely[0]) if unlikely.shape[0] else count
        rate = (1.0 + float(path_scores[:keep].sum())) / (self.row_seconds + self.token_seconds * keep)
        return keep, rate


class StepCost:
    """The engine's step time as ``fixed + per_token * tokens``, fitted online from the proposer's own calls.

    vLLM calls ``propose`` once per engine step, so the time from one call to the next is one step
    (the target's forward pass over every scheduled token, sampling, verification and this
    proposer's own drafting), and the tokens it verified are known: each row's one token plus the
    draft it was given. Steps that also prefilled a new request (a row appeared) are left out, and
    so is any step far slower than the fit (the machine was busy). The fit is a least-squares line
    over exponentially fading sums, so it follows a change of load or context length.
    """

    MIN_STEPS = 20  # steps before the fit is trusted

    def __init__(self, memory: float = 200.0) -> None:
        self.keep = 1.0 - 1.0 / memory
        self.sums = np.zeros(5)  # weight, x, y, xx, xy over (tokens, seconds)
        self.steps = 0

    def observe(self, tokens: int, seconds: float) -> None:
        fit = self.fit()
        if fit is not None and seconds > 4.0 * (fit[0] + fit[1] * tokens):
            return  # an outlier (a stall on a busy machine) would drag the line for hundreds of steps
        self.sums = self.sums * self.keep + np.array([1.0, tokens, seconds, tokens * tokens, tokens * seconds])
        self.steps += 1

    def fit(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per token), or None until enough varied steps were seen."""
        weight, x, y, xx, xy = self.sums
        spread = xx - x * x / weight if weight else 0.0
        if self.steps < self.MIN_STEPS or spread <= 1e-9 * weight:
            return None
        per_token = max(0.0, (xy - x * y / weight) / spread)
        fixed = max(per_token, (y - per_token * x) / weight)
        return fixed, per_token

    def cut(self, rows: int) -> ChainCut | None:
        """The chain cut for one of ``rows`` rows of the coming step, or None before the fit is trusted."""
        fit = self.fit()
        if fit is None:
            return None
        return ChainCut.of_step(*fit, rows)


class RowDrafter:
    """One request's drafting through Goose's sources: the only code here that knows their contract.

    ``start`` once per request (reset and prefill), then alternately ``learn`` (from vLLM's verdict
    on the previous chain) and ``propose`` (the next chain). ``sources`` is a
    :class:`goose.boundary.SourceSet`, which skips a faulty source for the cycle with one warning.
    """

    def __init__(self, names: Sequence[str], config: GooseConfig, *, vocab_size: int, eos_token_ids: frozenset[int],
                 tokenizer: Any, faults: FaultLog, estimates: dict[str, Any] | None) -> None:
        # one acceptance estimate per source for the whole engine, as one Goose decoder keeps across requests
        self.sources = SourceSet(list(names), config, vocab_size, faults=faults, estimates=estimates)
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.tokenizer = tokenizer
        self.harvest = Harvest.empty(config.harvest_top_k)  # vLLM passes no logits: nothing to harvest
        self.prompt_length = 0
        self.pending: Chain | None = None

    def context(self, tokens: np.ndarray) -> DecodeContext:
        return DecodeContext(tokens=tokens, prompt_length=self.prompt_length, vocab_size=self.vocab_size,
                             eos_token_ids=self.eos_token_ids, tokenizer=self.tokenizer)

    def start(self, tokens: np.ndarray, prompt_length: int) -> None:
        """A new request: ``tokens`` is its prompt and what vLLM has generated so far (the anchor last)."""
        self.prompt_length = prompt_length
        self.pending = None
        self.sources.reset()
        self.sources.prefill(self.context(tokens), self.harvest)

    def learn(self, sampled: Sequence[int]) -> None:
        """Tell the sources how vLLM verified the pending chain; ``sampled`` is what the step appended.

        vLLM appends the accepted draft tokens and one token of its own, so ``len(sampled) - 1``
        chain tokens were accepted and the next one, if any, was tested and rejected; unless it
        equals vLLM's own token, which a verified draft token never does (greedy or rejection
        sampling), so then the scheduler cut the chain there (token budget, model length) and it
        was never tested.
        """
        chain, self.pending = self.pending, None
        if chain is None:
            return
        accepted = len(sampled) - 1
        if list(sampled[:accepted]) != chain.tokens[:accepted]:
            return  # not the chain this request was given (a row we took for another request): learn nothing
        cut = accepted < len(chain.tokens) and sampled[-1] == chain.tokens[accepted]
        tested = min(len(chain.tokens), accepted + (0 if cut else 1))
        tree = chain.tree.keeping(np.arange(chain.tree.size) <= tested)  # the chain vLLM verified
        # vLLM's token at each verified row (the anchor's, then each accepted node's); a rejected leaf's row has none
        predictions = np.full(tree.size, -1, dtype=np.int64)
        predictions[: len(sampled)] = sampled
        outcome = walk(tree, predictions).outcome(list(sampled), self.harvest)
        self.sources.observe(outcome, {})

    def propose(self, tokens: np.ndarray, limit: int, cut: ChainCut) -> list[int]:
        """The next chain (at most ``limit`` tokens, possibly none) to follow ``tokens``, as long as ``cut`` says."""
        self.pending = None
        if limit <= 0:
            return []
        pool, _ = self.sources.propose(self.context(tokens))  # no source with auxiliary rows is ever enabled
        best: tuple[float, np.ndarray, int] | None = None
        for candidate in pool.drafting:  # most trusted first: on equal value the more trusted source drafts
            path_tokens, path_scores = candidate.draft.best_path  # chance that each token and all before it pass
            keep, rate = cut.length(path_scores[:limit])
            if keep and (best is None or rate > best[0]):
                best = (rate, path_tokens[:keep], candidate.source_id)
        if best is None:
            return []
        _, chain, source_id = best
        builder = TreeBuilder(int(tokens[-1]), pool.source_names, capacity=chain.shape[0])
        builder.add_chain(ROOT, chain, source_id, spine=True)
        drafted = [int(token) for token in chain]
        self.pending = Chain(drafted, source_id, builder.build())
        return drafted


@dataclass
class Tracked:
    """One request as the proposer knows it: its drafter, where and when it was last seen."""

    drafter: RowDrafter
    row: int
    seen: int  # number of the propose call that last saw it


def content_key(tokens: np.ndarray) -> int:
    """A request's identity at one step: a hash of all its tokens (prompt and output so far)."""
    return hash(tokens.tobytes())


class RequestTable:
    """Requests by content: a request is found again by the hash of its tokens at the previous step.

    Two rows with identical content (the same prompt submitted twice) hold two entries under one
    key; each row claims one, preferring the entry last seen in the same row.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.by_key: dict[int, list[Tracked]] = {}
        self.size = 0

    def claim(self, key: int, row: int) -> Tracked | None:
        """Take the request whose tokens hashed to ``key`` out of the table; None if there is none."""
        entries = self.by_key.get(key)
        if not entries:
            return None
        chosen = next((entry for entry in entries if entry.row == row), entries[0])
        entries.remove(chosen)
        if not entries:
            del self.by_key[key]
        self.size -= 1
        return chosen

    def put(self, key: int, entry: Tracked) -> None:
        self.by_key.setdefault(key, []).append(entry)
        self.size += 1

    def take_idle(self, now: int) -> Tracked | None:
        """Remove and return the least recently seen request not seen in call ``now`` (finished, most likely)."""
        oldest: tuple[int, Tracked] | None = None
        for key, entries in self.by_key.items():
            for entry in entries:
                if entry.seen < now and (oldest is None or entry.seen < oldest[1].seen):
                    oldest = (key, entry)
        if oldest is None:
            return None
        key, entry = oldest
        self.by_key[key].remove(entry)
        if not self.by_key[key]:
            del self.by_key[key]
        self.size -= 1
        return entry

    def trim(self, now: int) -> None:
        """Forget the least recently seen requests beyond ``capacity``."""
        while self.size > self.capacity and self.take_idle(now + 1) is not None:
            pass


class GooseProposer:
    """vLLM's ``custom_class`` proposer: one chain per row from Goose's sources.

    Built by vLLM as ``GooseProposer(vllm_config)``; reads only public configuration fields
    (``speculative_config.num_speculative_tokens``, ``model_config``, ``scheduler_config.max_num_seqs``).
    A subclass may set ``config`` to a :class:`ProposerConfig` instead of using the environment.
    """

    config: ClassVar[ProposerConfig | None] = None

    def __init__(self, vllm_config: Any) -> None:
        _ensure_log_output()
        settings = type(self).config or ProposerConfig.from_environment()
        for module in settings.plugins:
            plugins.register(importlib.import_module(module), origin=module)
        model_config = vllm_config.model_config
        self.num_speculative_tokens = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(model_config.max_model_len)
        self.vocab_size = int(model_config.get_vocab_size())
        self.tokenizer = _load_tokenizer(model_config)
        self.eos_token_ids = eos_token_ids(model_config.hf_config, self.tokenizer)
        self.goose_config = settings.goose_config(share=f"goose_vllm.{os.getpid()}.{next(_PROPOSERS)}")
        self.min_path_probability = settings.min_path_probability
        self.faults = FaultLog()
        self.names, skipped = usable_sources(settings.sources, self.goose_config, self.vocab_size)
        for name, reason in skipped.items():
            logger.warning("Goose source %r is off inside vLLM: %s", name, reason)
        if not self.names:
            raise ValueError(f"none of the configured Goose sources {settings.sources} can draft inside vLLM "
                             f"(see the warnings above); {CONFIG_ENV} must name at least one, e.g. context_match")
        self.estimates: dict[str, Any] | None = None  # shared by every drafter once the first one is made
        max_seqs = int(getattr(vllm_config.scheduler_config, "max_num_seqs", 256) or 256)
        self.requests = RequestTable(settings.max_requests or 4 * max_seqs)
        self.calls = 0
        self.step_cost = StepCost()
        self.clock = time.perf_counter  # what step times are read from (a replay may substitute a modelled clock)
        self._previous_step: tuple[float, int, int] | None = None  # (start, rows, tokens it scheduled for verifying)
        self._fault_logged: set[str] = set()
        self._cost_logged = False
        cut = ("as long as the measured step cost makes worthwhile" if self.min_path_probability is None
               else f"cut below path probability {self.min_path_probability:g}")
        logger.info("Goose proposer: sources %s, up to %d draft tokens a row, %s", list(self.names),
                    self.num_speculative_tokens, cut)

    def load_model(self, model: Any) -> None:
        """vLLM hands over the target model; Goose drafts without one."""
        del model

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None, **unused: Any) -> list[list[int]]:
        """One draft per row: ``sampled_token_ids[i]`` is what row i just gained (empty: skip the row).

        ``token_ids_cpu[i, :num_tokens_no_spec[i]]`` are row i's tokens, the sampled ones included;
        the table is vLLM's own and is only read (each row is copied first).
        """
        del slot_mappings, unused
        started = self.clock()
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        self.calls += 1
        rows: list[tuple[int, np.ndarray, list[int], Tracked | None]] = []
        for row, sampled in enumerate(sampled_token_ids):
            if not sampled:
                continue
            try:
                length = int(num_tokens_no_spec[row])
                tokens = np.array(token_ids_cpu[row, :length], dtype=np.int64)
                previous = content_key(tokens[: length - len(sampled)])
                rows.append((row, tokens, list(sampled), self.requests.claim(previous, row)))
            except Exception as error:  # a fault costs this row its draft, never vLLM's output
                self._log_fault(error)
        cut = self._chain_cut(started, rows, prefilling=len(rows) < len(sampled_token_ids))
        for row, tokens, sampled, tracked in rows:
            try:
                drafts[row] = self._draft(row, tokens, sampled, tracked, cut)
            except Exception as error:
                drafts[row] = []
                self._log_fault(error)
        self.requests.trim(self.calls)
        self._previous_step = (started, len(rows), sum(1 + len(drafts[row]) for row, *_ in rows))
        return drafts

    def _chain_cut(self, started: float, rows: list[tuple[int, np.ndarray, list[int], Tracked | None]],
                   prefilling: bool) -> ChainCut:
        """This step's rule for chain lengths; first, the step just finished joins the cost fit."""
        if self._previous_step is not None and rows and not prefilling:
            previous_start, previous_rows, scheduled = self._previous_step
            # the same requests as before: no prefill of a new one hides in the step's time
            if previous_rows == len(rows) and all(tracked is not None for *_, tracked in rows):
                self.step_cost.observe(scheduled, started - previous_start)
        if self.min_path_probability is not None:
            return ChainCut(threshold=self.min_path_probability)
        cut = self.step_cost.cut(max(1, len(rows)))
        if cut is None:
            return ChainCut(threshold=COLD_START_THRESHOLD)
        if not self._cost_logged:
            self._cost_logged = True
            fixed, per_token = self.step_cost.fit()  # type: ignore[misc]
            logger.info("Goose proposer: an engine step costs %.1f ms + %.2f ms per verified token (measured over "
                        "%d steps); chains are cut by it from now on", 1000 * fixed, 1000 * per_token,
                        self.step_cost.steps)
        return cut

    def _draft(self, row: int, tokens: np.ndarray, sampled: list[int], tracked: Tracked | None,
               cut: ChainCut) -> list[int]:
        if tracked is None:  # a request seen for the first time: a drafter whose request is gone, or a new one
            tracked = self.requests.take_idle(self.calls) or Tracked(self._new_drafter(), row, self.calls)
            tracked.drafter.start(tokens, prompt_length=tokens.shape[0] - len(sampled))
        else:
            tracked.drafter.learn(sampled)
        tracked.row, tracked.seen = row, self.calls
        limit = min(self.num_speculative_tokens, self.max_model_len - 1 - tokens.shape[0])
        draft = tracked.drafter.propose(tokens, limit, cut)
        self.requests.put(content_key(tokens), tracked)
        return draft

    def _new_drafter(self) -> RowDrafter:
        drafter = RowDrafter(self.names, self.goose_config, vocab_size=self.vocab_size,
                             eos_token_ids=self.eos_token_ids, tokenizer=self.tokenizer, faults=self.faults,
                             estimates=self.estimates)
        if self.estimates is None:
            self.estimates = drafter.sources.estimates
        return drafter

    def _log_fault(self, error: Exception) -> None:
        kind = type(error).__name__
        if kind not in self._fault_logged:
            self._fault_logged.add(kind)
            logger.warning("Goose proposer: no draft for a row after %s: %s (further faults of this kind are not "
                           "logged)", kind, error)


def usable_sources(names: Sequence[str], config: GooseConfig, vocab_size: int) -> tuple[list[str], dict[str, str]]:
    """The configured sources that can draft through vLLM's door, and why each other one cannot.

    vLLM gives a custom_class proposer the token table only and verifies the chain it returns, so a
    source that drafts only through successor queries (their table filled from the target's top-k
    at every verified row) or needs rows of its own in the verify pass has nothing to work with.
    """
    known, usable, skipped = plugins.registry(), [], {}
    for name in names:
        registration = known.source(name)  # a class's hooks are read off the class; a factory's off one product
        hooks = known.signatures(registration) or \
            Guarded(name, "source", made(registration, config), FaultLog()).implements
        if "goose_auxiliary_rows" in hooks:
            skipped[name] = ("it needs rows of its own in the target's verify pass (e.g. Lookahead's Jacobi "
                             "window), and vLLM verifies only the chain a custom_class proposer returns")
        elif "goose_propose" not in hooks:
            skipped[name] = ("it drafts only through successor queries from a table filled with the target's "
                             "top-k at every verified row, and vLLM passes no logits to a custom_class proposer")
        else:
            usable.append(name)
    return usable, skipped


def _load_tokenizer(model_config: Any) -> Any:
    """The target's tokenizer, for sources that work with text (REST's datastore); None if it will not load."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model_config.tokenizer, revision=model_config.tokenizer_revision,
                                             trust_remote_code=model_config.trust_remote_code)
    except Exception as error:  # sources that need it then draft nothing, with their own warning
        logger.warning("Goose proposer: the tokenizer of %s did not load (%s); text-based sources will not draft",
                       model_config.tokenizer, error)
        return None


def _ensure_log_output() -> None:
    """Give Goose's loggers and the proposer's a handler in vLLM's engine process, where only vLLM's own loggers have
    one."""
    for name in ("goose", logger.name):
        named = logging.getLogger(name)
        if not named.hasHandlers():
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
            named.addHandler(handler)
            named.setLevel(logging.INFO)


__all__ = ["CONFIG_ENV", "Chain", "ChainCut", "GooseProposer", "ProposerConfig", "RequestTable", "RowDrafter",
           "StepCost", "usable_sources"]
