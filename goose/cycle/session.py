"""The Goose cycle, top to bottom: requests decoding together, every row's tree verified in one forward pass.

A step either admits or cycles:

0. requests waiting for a slot join: each prompt runs as its own pass into its slot, and its first
   token, from that prefill, goes out at once (the sources read the prompt at the next step);

or, one cycle of every row decoding:

1. every row's sources draft (:class:`goose.cycle.drafting.RowCycle`); the pool ranks them;
2. the budget: the cost curve's split of the pass's rows by expected yield (one row: the best for its
   pool; :meth:`goose.planning.budget.BudgetPlanner.split`); each row's topology plans its tree;
3. one pass of the verifier verifies every tree (:mod:`goose.cycle.engine`: torch or llama.cpp);
4. each row walks (the longest path the target agrees with, then the bonus token) and commits to
   its own slot;
5. its sources learn from the outcome, and the planner from the cycle's times and yields. A
   finished or cancelled row frees its slot at once, and gives its sources back to the decoder.

Greedy, each row's output is token for token the target's greedy decoding of its prompt; sampled
(with a seed), the seeded autoregressive sampler's. Sources and topologies only change how many
tokens a pass yields. Without a :class:`Drafter` (the autoregressive decoder) every tree is the bare
anchor: plain decoding, one token a row a pass, through the same verifier.

A single request is a session of one (``GooseDecoder.generate`` and ``stream``), a batch a session of
several: the same steps either way. Each row drafts from sources its decoder lends it for the request
(:meth:`goose.cycle.drafting.Drafter.take_sources`: the decoder's own first) and gets back afterwards,
so what they learn carries over to the next request; their state is the request's but for the
sources that know the model rather than the request (``GooseConfig.batch_shared_sources``: one
instance for every row). Each row keeps its own acceptance estimates, sampler (its own seed) and
stopping rule, so every row's output is the one that prompt gets alone. A chunk's text is decoded
when first read (a stream's consumer), in order; nobody reading it costs nothing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from goose.contract.tree import DraftTree
from goose.cycle.detokenize import IncrementalText
from goose.cycle.drafting import Drafter, RowCycle
from goose.cycle.engine import Verifying
from goose.cycle.logprobs import TokenLogprob
from goose.cycle.request import GenerationResult, Request


@dataclass(frozen=True)
class Chunk:
    """What one step did for one request: the tokens it appended, their text (and log probabilities, with the
    ``logprobs`` option), and its result once it ended."""

    request_id: int
    token_ids: list[int]
    result: GenerationResult | None  # set on the request's last chunk
    logprobs: list[TokenLogprob] | None
    _decoded: IncrementalText
    _mark: int  # this chunk's tokens are the request's ``_mark``-th extension of its text

    @property
    def text(self) -> str:
        """The text these tokens complete (the last chunk: with whatever was held back), decoded when first read."""
        return self._decoded.piece(self._mark)

    @property
    def finished(self) -> bool:
        return self.result is not None


@dataclass
class _Row:
    """One request of the session: waiting for a slot, then decoding in one."""

    request_id: int
    request: Request
    text: IncrementalText
    cycle: RowCycle | None = None  # Goose's side of the cycle (None when decoding without drafting)
    prompt_logits: torch.Tensor | None = None  # the prefill's, until the sources have read the prompt


class Session:
    """Up to ``verifier.slots`` requests decoding together; more wait their turn in arrival order.

    Feed it with :meth:`submit` (a request its decoder built: ``GooseDecoder.request``), advance it with
    :meth:`step` (the chunks of every request that moved), stop a request with :meth:`cancel`. Call all three
    from one thread.
    """

    def __init__(self, verifier: Verifying, tokenizer: Any, drafter: Drafter | None) -> None:
        self.verifier = verifier
        self.max_batch = verifier.slots
        self.tokenizer, self.drafter = tokenizer, drafter
        self.rows: list[_Row] = []  # the decoding requests, row i in slot i
        self.waiting: deque[_Row] = deque()
        self._next_id = 0
        self.pass_rows: deque[int] = deque(maxlen=4096)  # rows of the latest passes (the batch-size record)

    @property
    def active(self) -> int:
        """Requests decoding or waiting."""
        return len(self.rows) + len(self.waiting)

    def submit(self, request: Request) -> int:
        """Queue ``request`` (new, from the decoder's ``request``, where bad input raises); returns its id. A request
        that would not fit a slot of the cache budget raises here (``CacheBudgetError``)."""
        self.verifier.check_fits(len(request.prompt_ids) + request.max_new_tokens)
        row = _Row(self._next_id, request, IncrementalText(self.tokenizer))
        self._next_id += 1
        self.waiting.append(row)
        return row.request_id

    def cancel(self, request_id: int) -> GenerationResult | None:
        """Stop a request now (its slot is freed at once); its result so far, or None if it is unknown or done."""
        for row in self.waiting:
            if row.request_id == request_id:
                self.waiting.remove(row)
                row.request.stop_reason = "stopped"
                return row.request.result(self.tokenizer)
        for slot, row in enumerate(self.rows):
            if row.request_id == request_id:
                row.request.stop_reason = "stopped"
                self._release(slot)
                return row.request.result(self.tokenizer)
        return None

    def idle(self, seconds: float) -> None:
        """Leave ``seconds`` out of the decoding requests' time (a stream's consumer held the step)."""
        for row in self.rows:
            row.request.started += seconds

    def step(self) -> list[Chunk]:
        """Admit waiting requests to free slots (their first tokens), or else one cycle of every row."""
        joining = min(len(self.waiting), self.max_batch - len(self.rows))
        chunks = [self._join(self.waiting.popleft()) for _ in range(joining)] if joining else \
            self._cycle() if self.rows else []
        for slot in reversed(range(len(self.rows))):  # from the last: a freed slot takes the last row
            if self.rows[slot].request.stop_reason is not None:
                self._release(slot)
        return chunks

    def run(self) -> Iterator[Chunk]:
        """Step until every request has finished, yielding chunks as they come."""
        while self.active:
            yield from self.step()

    # --- 0. a request joins: its prefill and first token ------------------------------------

    def _join(self, row: _Row) -> Chunk:
        request, drafter = row.request, self.drafter
        request.started = time.perf_counter()
        if drafter is not None:
            row.cycle = RowCycle(drafter, request, drafter.take_sources())
        harvest = row.cycle.harvest_rows() if row.cycle is not None else 0
        logits = self.verifier.prefill(request.prompt_ids, logits_to_keep=harvest + 1)
        request.accept_scored([request.next_token(logits[-1], request.length)], logits, [logits.shape[0] - 1])
        request.stats.prefill_s = time.perf_counter() - request.started
        if row.cycle is not None:
            row.cycle.clock.lap("prefill")
            row.prompt_logits = logits
        self.rows.append(row)
        return self._chunk(row, request.tokens[-1:].tolist())

    # --- 1-5. one cycle of every row ---------------------------------------------------------

    def _cycle(self) -> list[Chunk]:
        verifier, rows = self.verifier, self.rows
        full = verifier.full()
        for slot in full:  # a row at the model's last position ends here
            rows[slot].request.stop_reason = "context_full"
        if full:
            return [self._chunk(rows[slot], []) for slot in full]
        for row in rows:  # the sources of the rows that joined last step read their prompts
            if row.cycle is not None and row.prompt_logits is not None:
                row.cycle.begin(row.prompt_logits)
                row.prompt_logits = None
        started = time.perf_counter()
        trees = self._plan(verifier.room())  # 1-2. draft, budget, plan
        auxiliary = [row.cycle.auxiliary_rows if row.cycle is not None else [] for row in rows]
        verify_started = time.perf_counter()  # 3. one pass over every tree and its auxiliary rows
        logits = verifier.verify(trees, auxiliary)
        verify_s = time.perf_counter() - verify_started
        widths = [row_logits.shape[0] for row_logits in logits]
        self.pass_rows.append(sum(widths))
        chunks = []
        for slot, (row, row_logits) in enumerate(zip(rows, logits, strict=True)):  # 4-5. walk, commit, learn
            if row.cycle is None:
                kept = row.request.step_plainly(row_logits)
                verifier.commit(slot, np.zeros(0, dtype=np.int64))
            else:
                path, kept = row.cycle.conclude(row_logits, verifier.lengths[slot])
                verifier.commit(slot, path)
            row.request.stats.batch_rows.append(len(rows))
            chunks.append(self._chunk(row, kept))
        self._learn(widths, verify_s, time.perf_counter() - started - verify_s)
        return chunks

    def _plan(self, room: list[int]) -> list[DraftTree]:
        """1-2. Every row's tree: drafted by its sources, sized by the budget, planned by its topology."""
        drafter = self.drafter
        if drafter is None:
            return [DraftTree.single(int(row.request.tokens[-1])) for row in self.rows]
        cycles = [row.cycle for row in self.rows if row.cycle is not None]
        planner = drafter.budget_planner
        for cycle, row_room in zip(cycles, room, strict=True):
            cycle.draft(row_room, planner)
        budgets = drafter.budgets(cycles)
        for cycle, budget in zip(cycles, budgets, strict=True):
            cycle.stats.row_budgets.append(budget)
        return [cycle.plan(min(budget, row_room - cycle.riding))
                for cycle, budget, row_room in zip(cycles, budgets, room, strict=True)]

    def _learn(self, widths: list[int], verify_s: float, host_s: float) -> None:
        """5. The planner folds in the cycle's host time per row, what the pass cost, and every row's tree and
        yield."""
        planner = self.drafter.budget_planner if self.drafter is not None else None
        if planner is None:
            return
        planner.observe_overhead(host_s / len(self.rows))
        # a batched pass pads every row to the widest: it verified that many rows a request
        planner.observe_pass(len(widths), len(widths) * max(widths), verify_s)
        for row in self.rows:
            if row.cycle is not None and row.cycle.tree is not None:
                planner.observe_cycle(row.cycle.tree.size, row.request.stats.accepted_lengths[-1])

    # --- a request leaves -----------------------------------------------------------------------

    def _release(self, slot: int) -> None:
        row = self.rows[slot]
        moved = self.verifier.release(slot)
        if moved is not None:
            self.rows[slot] = self.rows[moved]
        self.rows.pop()
        if row.cycle is not None:
            row.cycle.drafter.give_back(row.cycle.slot)

    def _chunk(self, row: _Row, token_ids: list[int]) -> Chunk:
        ended = row.request.stop_reason is not None
        mark = row.text.extend(token_ids, last=ended)
        return Chunk(row.request_id, token_ids, row.request.result(self.tokenizer) if ended else None,
                     row.request.recent_logprobs(len(token_ids)), row.text, mark)
