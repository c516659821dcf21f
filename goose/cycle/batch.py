"""Many requests at once: every row drafts and plans its own tree, one forward pass verifies them all.

The batched cycle, per step:

1. requests waiting for a slot join: each prompt runs as its own pass into its slot (its first token
   comes from that prefill, as in the single-request loop);
2. every row's sources draft (:class:`goose.cycle.decoder.RowCycle`, the same code as one request's);
3. the budget planner splits the pass's rows across the requests by expected yield
   (:meth:`goose.planning.budget.BudgetPlanner.split`) and each row's topology plans its tree;
4. one pass of :class:`goose.cycle.batch_verifier.BatchVerifier` verifies every tree;
5. each row walks, commits to its own slot, and its sources learn; a finished or cancelled row frees
   its slot at once.

Each row keeps its own sources (their state is the request's), acceptance estimates, sampler
(its own seed) and stopping rule, so every row's output is the one that prompt gets alone. With an
:class:`AutoregressiveDecoder` the same engine decodes without drafting: the batched baseline.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from goose import plugins
from goose.contract.boundary import SourceSet
from goose.contract.tree import DraftTree
from goose.cycle.batch_verifier import BatchVerifier
from goose.cycle.decoder import GenerationResult, GooseDecoder, Prompt, RowCycle, _Decoding, _Request
from goose.cycle.detokenize import IncrementalText
from goose.cycle.logprobs import TokenLogprob
from goose.cycle.stats import GenerationStats
from goose.planning.cost import BatchCosts


@dataclass(frozen=True)
class BatchEvent:
    """What one step did for one request: the tokens it appended, their text (and log probabilities, with the
    ``logprobs`` option), and its result once it ended."""

    request_id: int
    token_ids: list[int]
    text: str
    result: GenerationResult | None = None  # set on the request's last event
    logprobs: list[TokenLogprob] | None = None

    @property
    def finished(self) -> bool:
        return self.result is not None


@dataclass
class _Row:
    """One request of the batch: waiting for a slot, then decoding in one."""

    request_id: int
    request: _Request
    text: IncrementalText
    stats: GenerationStats = field(default_factory=GenerationStats)
    cycle: RowCycle | None = None  # Goose's side of the cycle (None when decoding without drafting)
    started: float = field(default_factory=time.perf_counter)


class BatchSession:
    """Up to ``max_batch`` requests decoding together; more wait their turn in arrival order.

    Feed it with :meth:`submit`, advance it with :meth:`step` (one batched cycle: the events of every
    request that moved), stop a request with :meth:`cancel`. Call all three from one thread.
    """

    def __init__(self, decoder: _Decoding, max_batch: int, cache_positions: int | None = None) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.decoder = decoder
        self.max_batch = max_batch
        self.verifier = BatchVerifier(decoder.model, max_batch, cache_positions)
        self.rows: list[_Row] = []  # the decoding requests, row i in slot i
        self.waiting: deque[_Row] = deque()
        self._next_id = 0
        self._spare_sources: dict[tuple[str, ...], list[SourceSet]] = {}  # released rows' sets, to reuse
        self._shared_sources = self._make_shared_sources()  # GooseConfig.batch_shared_sources: one instance each
        self.pass_rows: list[int] = []  # rows of every pass so far (the batch-size record)
        self._costs: BatchCosts | None = None  # the batched passes' cost curves, measured when first needed

    @property
    def active(self) -> int:
        """Requests decoding or waiting."""
        return len(self.rows) + len(self.waiting)

    def submit(self, prompt: Prompt, max_new_tokens: int = 128, **options: Any) -> int:
        """Queue a request (options as for ``GooseDecoder.stream``); returns its id. Bad input raises here, and so
        does a request that would not fit a slot of the cache (``CacheBudgetError``, a ``ContextOverflowError``)."""
        request = self.decoder._request(prompt, max_new_tokens, dict(options))
        self.verifier.check_fits(len(request.prompt_ids) + max_new_tokens)
        row = _Row(self._next_id, request, IncrementalText(self.decoder.tokenizer))
        self._next_id += 1
        self.waiting.append(row)
        return row.request_id

    def cancel(self, request_id: int) -> GenerationResult | None:
        """Stop a request now (its slot is freed at once); its result so far, or None if it is unknown or done."""
        for row in self.waiting:
            if row.request_id == request_id:
                self.waiting.remove(row)
                row.request.stop_reason = "stopped"
                return self._result(row)
        for slot, row in enumerate(self.rows):
            if row.request_id == request_id:
                row.request.stop_reason = "stopped"
                self._release(slot)
                return self._result(row)
        return None

    def step(self) -> list[BatchEvent]:
        """Admit waiting requests to free slots, then one batched cycle; the events of this step."""
        events = [self._join(self.waiting.popleft()) for _ in range(min(len(self.waiting),
                                                                      self.max_batch - len(self.rows)))]
        self._release_finished()  # a request may end with its first token
        if self.rows:
            events += self._cycle()
        self._release_finished()
        return events

    def run(self) -> Iterator[BatchEvent]:
        """Step until every request has finished, yielding events as they come."""
        while self.active:
            yield from self.step()

    # --- a request's life -----------------------------------------------------------------------

    def _join(self, row: _Row) -> BatchEvent:
        decoder, request = self.decoder, row.request
        row.started = time.perf_counter()
        harvest = 0
        if isinstance(decoder, GooseDecoder):
            row.cycle = RowCycle(decoder, request, row.stats, self._sources(request))
            row.cycle.sources.reset(keep=frozenset(self._shared_sources))
            harvest = row.cycle.harvest_rows()
        _, logits = self.verifier.prefill(request.prompt_ids, logits_to_keep=harvest + 1)
        request.accept_scored([request.next_token(logits[-1], request.length)], logits, [logits.shape[0] - 1])
        row.stats.prefill_s = time.perf_counter() - row.started
        self.rows.append(row)
        event = self._event(row, request.tokens[-1:].tolist())
        if row.cycle is not None:
            row.cycle.begin(logits)  # the first token goes out before the sources read the prompt
        return event

    def _sources(self, request: _Request) -> SourceSet:
        decoder = self.decoder
        assert isinstance(decoder, GooseDecoder)
        names = decoder.source_names(request.prediction is not None)
        spare = self._spare_sources.get(names)
        if spare:
            return spare.pop()
        return SourceSet(names, decoder.config, self.verifier.vocab_size, faults=decoder.sources.faults,
                         instances=self._shared_sources)

    def _make_shared_sources(self) -> dict[str, Any]:
        """One instance of each source in ``batch_shared_sources``, for every row's source set to hold."""
        decoder = self.decoder
        if not isinstance(decoder, GooseDecoder):
            return {}
        names = decoder.config.batch_shared_sources
        drafting = decoder.source_names(True)
        if names == "auto":
            sources = plugins.registry().sources
            names = [name for name in drafting if name in sources and sources[name].shareable]
        unused = set(names) - set(drafting)
        if unused:
            raise ValueError(f"batch_shared_sources names {', '.join(sorted(unused))}, which this decoder does not "
                             f"draft from (its sources: {', '.join(decoder.sources.names)})")
        if not names:
            return {}
        shared = SourceSet(names, decoder.config, self.verifier.vocab_size, faults=decoder.sources.faults)
        return dict(shared.instances)

    def _release_finished(self) -> None:
        for slot in reversed(range(len(self.rows))):  # from the last: a freed slot takes the last row
            if self.rows[slot].request.stop_reason is not None:
                self._release(slot)

    def _release(self, slot: int) -> None:
        row = self.rows[slot]
        moved = self.verifier.release(slot)
        if moved is not None:
            self.rows[slot] = self.rows[moved]
        self.rows.pop()
        if row.cycle is not None:
            self._spare_sources.setdefault(row.cycle.sources.names, []).append(row.cycle.sources)

    def _event(self, row: _Row, token_ids: list[int]) -> BatchEvent:
        piece = row.text.add(token_ids)
        logprobs = row.request.recent_logprobs(len(token_ids))
        if row.request.stop_reason is not None:
            piece += row.text.finish()
            return BatchEvent(row.request_id, token_ids, piece, self._result(row), logprobs)
        return BatchEvent(row.request_id, token_ids, piece, logprobs=logprobs)

    def _result(self, row: _Row) -> GenerationResult:
        return self.decoder._result(row.request, row.stats, row.started)

    # --- the batched cycle ----------------------------------------------------------------------

    def _cycle(self) -> list[BatchEvent]:
        verifier, rows = self.verifier, self.rows
        full = verifier.full()
        for i in full:  # a row at the model's last position ends here, as the single loop does
            rows[i].request.stop_reason = "context_full"
        if full:
            return [self._event(rows[i], []) for i in full]
        cycle_started = time.perf_counter()
        trees = self._plan(verifier.room())
        auxiliary = [row.cycle.auxiliary_rows if row.cycle is not None else [] for row in rows]
        verify_started = time.perf_counter()
        logits = verifier.verify(trees, auxiliary)
        verify_s = time.perf_counter() - verify_started
        widths = [row_logits.shape[0] for row_logits in logits]  # each row's tree and auxiliary rows
        self.pass_rows.append(sum(widths))
        if self._costs is not None:  # what the pass really cost corrects the curve the next split reads
            self._costs.observe(len(trees), len(trees) * max(widths), verify_s)
        events = []
        for slot, (row, row_logits) in enumerate(zip(rows, logits, strict=True)):
            row.stats.batch_rows.append(len(rows))
            if row.cycle is None:
                path = np.zeros(0, dtype=np.int64)
                kept = row.request.accept_scored([row.request.next_token(row_logits[0], row.request.length)],
                                                 row_logits, [0])
                row.stats.verify_steps += 1
                row.stats.accepted_lengths.append(len(kept))
            else:
                path, kept = row.cycle.conclude(row_logits, verifier.lengths[slot])
            verifier.commit(slot, path)
            events.append(self._event(row, kept))
        self._learn(time.perf_counter() - cycle_started - verify_s)
        return events

    def _plan(self, room: list[int]) -> list[DraftTree]:
        """Every row's tree: drafted by its sources, sized by the budget split, planned by the topology."""
        decoder = self.decoder
        if not isinstance(decoder, GooseDecoder):
            return [DraftTree.single(int(row.request.tokens[-1])) for row in self.rows]
        cycles = [row.cycle for row in self.rows if row.cycle is not None]
        planner = decoder.budget_planner
        for cycle, row_room in zip(cycles, room, strict=True):
            cycle.draft(row_room, planner)
        if decoder.config.budget == "auto" and planner is not None:
            if self._costs is None:
                self._costs = BatchCosts(decoder.model, planner.curve)
            budgets = planner.split([planner.yields(cycle.pool, decoder.topology.spine_lengths) for cycle in cycles],
                                    [cycle.riding for cycle in cycles], self._costs.curve(len(cycles)))
        else:
            budgets = [decoder.config.fixed_budget()] * len(cycles)
        for row, budget in zip(self.rows, budgets, strict=True):
            row.stats.row_budgets.append(budget)
        caps = [row_room - cycle.riding for cycle, row_room in zip(cycles, room, strict=True)]
        return [cycle.plan(min(budget, cap)) if min(budget, cap) > 0 else cycle.plan_nothing()
                for cycle, budget, cap in zip(cycles, budgets, caps, strict=True)]

    def _learn(self, host_s: float) -> None:
        """The planner folds in the cycle's host time per row and every row's tree and yield."""
        planner = self.decoder._budget_planner if isinstance(self.decoder, GooseDecoder) else None
        if planner is None:
            return
        planner.observe_overhead(host_s / len(self.rows))
        for row in self.rows:
            if row.cycle is not None and row.cycle.tree is not None:
                planner.observe_cycle(row.cycle.tree.size, row.stats.accepted_lengths[-1])


def generate_batch(decoder: _Decoding, prompts: Sequence[Prompt], max_new_tokens: int = 128,
                   max_batch: int | None = None, cache_positions: int | None = None,
                   **options: Any) -> list[GenerationResult]:
    """Decode ``prompts`` together, at most ``max_batch`` at a time (default: all); one result per prompt, in order.

    ``options`` apply to every prompt (as for ``GooseDecoder.stream``); a ``seed`` seeds each prompt's own
    sampler, so every output is the one that prompt gets alone with that seed.
    """
    if not prompts:
        return []
    session = BatchSession(decoder, max_batch or len(prompts), cache_positions)
    ids = [session.submit(prompt, max_new_tokens, **options) for prompt in prompts]
    results: dict[int, GenerationResult] = {}
    for event in session.run():
        if event.result is not None:
            results[event.request_id] = event.result
    return [results[i] for i in ids]
