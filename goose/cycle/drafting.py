"""Goose's side of the cycle: what a decoder drafts with (:class:`Drafter`) and one request's row (:class:`RowCycle`).

A row drafts, plans its tree and, once the session's pass (:mod:`goose.cycle.session`) has verified
it, walks it, keeps the agreed tokens and lets every source learn.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from goose import plugins
from goose.boundary import FaultLog, SourceSet, TopologyPlanner
from goose.config import GooseConfig
from goose.contract.candidates import CandidatePool, DecodeContext
from goose.contract.outcome import AuxiliaryRows, Harvest, PathKind
from goose.contract.tree import ROOT, DraftTree
from goose.cycle import calibration
from goose.cycle.readout import greedy_and_top_k, read
from goose.cycle.request import Request
from goose.cycle.sampling import Sampler
from goose.cycle.stats import GenerationStats
from goose.cycle.walker import walk, walk_sampled
from goose.planning.budget import BudgetPlanner, lead
from goose.planning.cost import CostCurve, harvest_rows

# A row the budget lays no tree for rests REST cycles (plain decoding steps: no source drafts or learns,
# they catch up from the context when it drafts again), so that where no tree pays Goose costs about what
# plain decoding does: the host's own time a drafted cycle (1-2 ms with SmolLM2 against a 45 ms pass on
# the 2-core EPYC) is paid one cycle in REST + 1, and a copy that begins is seen within REST tokens. After
# PROBE_FIRST drafted cycles without a tree it lays a one-node probe, the wait doubling up to PROBE_LAST
# while no probe is accepted: on the AVX2 EPYC's llama.cpp curve (t(2) = 1.42 t(1)) a prompt where no
# draft is ever accepted pays 0.42 of a token every 80 at worst, 0.5%.
REST = 4
PROBE_FIRST = 2
PROBE_LAST = 16


class Drafter:
    """A Goose decoder's sources, topology and budget planner, which every request it decodes drafts with.

    Sources and the topology are made once (their state, such as a persistent adjacency table or the
    acceptance estimates, lives as long as the decoder). With ``budget="auto"`` the budget follows
    ``cost_curve``, or this device's measured curve, loaded (and measured once, if no cached one
    exists) when the first generation needs it. Decoding, the passes' measured times correct that
    curve as they come; with ``pinned_costs`` nothing measured moves it (a study's decoders: every
    budget then follows from the drafts and the curve alone, the same on any machine and any load).
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, config: GooseConfig,
                 vocab_size: int, profile: bool = False, cost_curve: CostCurve | None = None,
                 pinned_costs: bool = False) -> None:
        if not config.sources:
            raise plugins.PluginError("no sources enabled: name at least one with --sources")
        self.model, self.tokenizer, self.config, self.vocab_size = model, tokenizer, config, vocab_size
        self.faults = faults = FaultLog()  # every source's and the topology's: a fault is credited to its request
        # the shareable sources' instances (knowledge of the model, not of a request) serve every row it decodes
        self.shared = self._shared_instances(tuple(config.sources), faults)
        self.sources = SourceSet(config.sources, config, vocab_size, faults=faults, instances=self.shared)
        self.topology = TopologyPlanner(config.topology, config, vocab_size, faults=faults)
        self.profile = profile
        self.draw_all_rows = False  # sampled: draw every tree row in one batch on the CPU too (as on a GPU)
        self._cost_curve = cost_curve
        self.pinned_costs = pinned_costs
        self._budget_planner: BudgetPlanner | None = None
        self.spare = [SourceSlot(self.sources)]  # the slots no request holds now, the decoder's own first
        # auxiliary rows to price: known once, not looked up in every cycle's two reads of budget_planner
        self._prices_rows = config.price_rows and any(self.sources.implements(name, "goose_auxiliary_rows")
                                                      for name in self.sources.names)

    @property
    def budget_planner(self) -> BudgetPlanner | None:
        """The planner that prices rows with the cost curve: for the automatic budget and for auxiliary rows.

        None with a fixed budget and no row to price; its cost curve is loaded on first use.
        """
        if self.config.budget != "auto" and not self._prices_rows:
            return None
        if self._budget_planner is None:
            curve = self._cost_curve if self._cost_curve is not None else calibration.load_or_measure(self.model)
            self._budget_planner = BudgetPlanner(
                curve, max_depth=self.config.max_depth, pinned=self.pinned_costs,
                batch_curve=lambda batch: calibration.load_or_measure(self.model, batch=batch))
        return self._budget_planner

    def source_names(self, with_prediction: bool) -> tuple[str, ...]:
        """The sources a request drafts from: the decoder's, with the sources that draft from a prediction in front
        for a request that carries one (:func:`prediction_first`)."""
        return prediction_first(self.sources.names) if with_prediction else self.sources.names

    def take_sources(self) -> SourceSlot:
        """Sources for one request, in a session of any size: a spare slot (the decoder's own first, so a
        request at a time always drafts from them), else a new one holding the shared instances. What a
        slot's sources learn stays with it for the next request that takes it (:meth:`give_back`)."""
        try:
            return self.spare.pop()  # one atomic step: sessions on other threads may be taking too
        except IndexError:
            pass
        return SourceSlot(SourceSet(self.sources.names, self.config, self.vocab_size, faults=self.sources.faults,
                                    instances=self.shared, strict=False))

    def give_back(self, slot: SourceSlot) -> None:
        """A request has left: its slot serves the next one. If its passes contradicted the cached cost curve,
        the corrected curve replaces it on disk (a curve given to the decoder is the caller's, never written)."""
        self.spare.append(slot)
        planner = self._budget_planner
        corrected = planner.contradicted() if planner is not None and self._cost_curve is None else None
        if corrected is not None:
            calibration.correct(self.model, corrected)

    def budgets(self, cycles: list[RowCycle]) -> list[int]:
        """2. Every drafted row's budget for this pass: the fixed budget, or the cost curve's split of the pass."""
        planner = self.budget_planner
        if self.config.budget != "auto" or planner is None:
            return [self.config.fixed_budget()] * len(cycles)
        drafted = [cycle for cycle in cycles if cycle.pool is not None]  # the others rest: the anchor alone
        chosen = planner.split([cycle.pool for cycle in drafted], self.topology.spine_lengths,
                               [cycle.riding for cycle in drafted]) if drafted else []
        if not planner.pinned:  # a study's decoder lays its best trees: no rest, no probe
            alone = len(cycles) == 1  # a batched pass's 0 is the split's (rows priced together), not a loss to rest
            chosen = [cycle.probed(budget, alone) for cycle, budget in zip(drafted, chosen, strict=True)]
        for row, (cycle, budget) in enumerate(zip(drafted, chosen, strict=True)):  # what each tree is expected to give
            cycle.promised = planner.promise(row, budget) if budget > 0 else None
        budgets = iter(chosen)
        return [next(budgets) if cycle.pool is not None else 0 for cycle in cycles]

    def _shared_instances(self, drafting: tuple[str, ...], faults: FaultLog) -> dict[str, Any]:
        """One instance of each source in ``batch_shared_sources``, for every slot's set to hold."""
        names = self.config.batch_shared_sources
        drafting = prediction_first(drafting)
        if names == "auto":
            sources = plugins.registry().sources
            names = [name for name in drafting if name in sources and sources[name].shareable]
        unused = set(names) - set(drafting)
        if unused:
            raise ValueError(f"batch_shared_sources names {', '.join(sorted(unused))}, which this decoder does not "
                             f"draft from (its sources: {', '.join(self.config.sources)})")
        return dict(SourceSet(names, self.config, self.vocab_size, faults=faults).instances) if names else {}


def prediction_first(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` with every registered source that drafts from a request's prediction (``needs_request=
    "prediction"``: the built-in ``prediction`` and any plugin's) in front, unless already among them."""
    return (*(name for name in plugins.registry().needing("prediction") if name not in names), *names)


class SourceSlot:
    """The sources one request drafts from, lent by its decoder (:meth:`Drafter.take_sources`) for the request.

    A set of the decoder's sources with their acceptance estimates, when each one's auxiliary rows last
    rode, and the same set with the prediction source in front (made on the first request with a
    prediction, sharing every other instance and estimate, so what they learn carries over either way).
    """

    def __init__(self, sources: SourceSet) -> None:
        self.sources = sources
        self.unpriced: dict[str, int] = {}  # per source: cycles since its auxiliary rows last rode
        self.predicting: SourceSet | None = None

    def drafting(self, drafter: Drafter, with_prediction: bool) -> SourceSet:
        """The set a request drafts from: with the sources that draft from a prediction (:func:`prediction_first`)
        for a request that carries one."""
        names = prediction_first(self.sources.names) if with_prediction else self.sources.names
        if names == self.sources.names:
            return self.sources
        if self.predicting is None:
            self.predicting = SourceSet(names, drafter.config, drafter.vocab_size,
                                        faults=self.sources.faults, estimates=self.sources.estimates,
                                        instances=self.sources.instances, strict=False)
        return self.predicting


class RowCycle:
    """One request's side of the Goose cycle: its sources draft, its topology plans, it walks and learns."""

    def __init__(self, drafter: Drafter, request: Request, slot: SourceSlot) -> None:
        self.drafter, self.request, self.slot = drafter, request, slot
        self.sources = slot.drafting(drafter, request.prediction is not None)
        self.stats = request.stats
        self.serve()
        self.sources.reset(keep=frozenset(drafter.shared))  # a new request: all but the shared instances start over
        self.unpriced = slot.unpriced
        self.clock = _PhaseClock(self.stats if drafter.profile else None)
        self.pool: CandidatePool | None = None
        self.auxiliary: list[tuple[str, AuxiliaryRows]] = []
        self.tree: DraftTree | None = None
        self.masks: Any = None  # a constrained request's grammar bitmask of every tree row
        self.started = 0.0
        self.unlaid = 0  # drafted cycles in a row the budget laid no tree for
        self.probe_wait = PROBE_FIRST  # such cycles before the next one-node probe
        self.probing = False
        self.resting = 0  # plain steps left before the sources draft again
        self.promised: float | None = None  # the E[tau] the automatic budget planned for this cycle's tree

    def harvest_rows(self) -> int:
        """Prompt rows whose logits the prefill keeps for the sources (``GooseConfig.prefill_harvest``): with the
        automatic budget ``"auto"`` is none (the first token waits for no row); with a fixed one, or a study's
        pinned curve (the paper's setting: what the sources draft is measured), all of them."""
        config = self.drafter.config
        priced = config.budget == "auto" and not self.drafter.pinned_costs
        return harvest_rows(config.prefill_harvest, len(self.request.prompt_ids), priced=priced)

    def serve(self) -> None:
        """The plugins' faults from now on are this request's (``stats.faults``): rows of a session take turns."""
        self.drafter.faults.serving = self.stats.faults

    def begin(self, prompt_logits: torch.Tensor) -> None:
        """The sources read the prompt and the top-k of its harvested rows (``prompt_logits`` [h + 1, V])."""
        self.serve()
        self.clock.start()
        if self.request.stop_reason is None:
            self.sources.prefill(self.context(), _prompt_harvest(self.request.prompt_ids, prompt_logits[:-1],
                                                                 self.drafter.config.harvest_top_k))
        self.clock.lap("prefill")

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
        self.serve()
        self.started = self.clock.start()
        if self.resting:  # a plain step: the sources neither draft nor learn (they catch up from the context)
            self.resting -= 1
            self.pool, self.auxiliary = None, []
            return
        left = self.request.max_new_tokens - self.request.produced  # a deeper draft token could not be kept
        self.pool, offered = self.sources.propose(self.context(), left)
        self.auxiliary = self._rows_that_pay(_fitting(offered, room), planner)
        self.clock.lap("draft")

    def probed(self, budget: int, may_rest: bool = True) -> int:
        """The budget; where it is 0 the row rests ``REST`` cycles (a request decoding alone, with no auxiliary
        rows riding: those rows are their source's way to learn), or probes with 1 node after ``probe_wait``
        drafted cycles without a tree.

        An estimate moves only when one of its source's nodes is tested, so one that fell too low for
        any tree to pay would otherwise never rise again, even where the prompt turns to copying. The
        probe is the cheapest tree, the best draft's first token; the wait doubles after each probe
        nothing accepted (up to ``PROBE_LAST``) and starts over when one is.
        """
        pool = self.pool
        if pool is None:  # resting
            return 0
        if budget > 0:
            self.unlaid = 0
            return budget
        self.resting = REST if may_rest and not self.riding else 0
        if not (pool.drafting or pool.branching):  # nothing to probe
            return 0
        self.unlaid += 1
        if self.unlaid < self.probe_wait:
            return 0
        self.unlaid, self.probing, self.resting = 0, True, 0
        return 1

    def plan(self, budget: int) -> DraftTree:
        """2. The topology turns the pool into a draft tree of at most ``budget`` draft nodes (of a constrained
        request: without the drafted tokens its grammar forbids); budget 0: the bare anchor."""
        self.serve()
        if self.pool is None:  # resting: the bare anchor (a grammar masks its row in the plain step)
            self.tree = DraftTree.single(int(self.request.tokens[-1]))
            return self.tree
        tree = self.drafter.topology.plan(self.pool, budget) if budget > 0 else \
            DraftTree.single(self.pool.anchor, self.pool.source_names)
        constraint = self.request.constraint
        if constraint is not None:  # between the plan and the pass: the grammar cuts and masks the tree
            tree, self.masks = constraint.plan(tree)
        self.tree = tree
        self.clock.lap("plan")
        return tree

    def conclude(self, logits: torch.Tensor, past: int) -> tuple[Any, list[int]]:
        """4-5. Walk the verified rows ``logits`` (tree rows, then auxiliary rows; the anchor at position
        ``past``), keep the tokens, let every source learn. Returns (the accepted path, the tokens kept);
        the caller commits the path to its cache."""
        self.clock.lap("verify")
        self.serve()
        tree, pool, request = self.tree, self.pool, self.request
        assert tree is not None
        if pool is None:  # resting: a plain decoding step
            kept = request.accept_scored([request.next_token(logits[0], request.length)], logits, [ROOT])
            self.stats.record_step(len(kept), 1, PathKind.BONUS, {})
            self.clock.lap("walk+commit")
            return np.zeros(0, dtype=np.int64), kept
        if request.constraint is not None:
            request.constraint.apply(logits, self.masks)
        readout = read(logits, tree.size, self.drafter.config.harvest_top_k)
        # 4. walk: the longest path the target agrees with, then the bonus token
        if request.sampler is None:
            walked = walk(tree, readout.predictions[: tree.size])
        else:
            walked = walk_sampled(tree, self._draws(request.sampler, logits, past))
        # the anchor's row predicted the first kept token, each accepted node's row the next (the bonus last)
        kept = request.accept_scored(walked.tokens, logits, [ROOT, *walked.path.tolist()])
        self.clock.lap("walk+commit")
        # 5. every source learns from the outcome; the boundary updates their acceptance estimates
        outcome = walked.outcome(kept, Harvest.of_tree(tree, pool.previous, readout.top_tokens, readout.top_scores))
        counts = self.sources.observe(outcome, _split_auxiliary(self.auxiliary, readout.predictions[tree.size :]))
        self.stats.record_step(len(kept), tree.size, walked.kind, counts, self.riding)
        planner = self.drafter.budget_planner
        if self.promised is not None and planner is not None and tree.size > 1:  # what it was to give, what it gave
            planner.observe_tree(lead(pool) or "", self.promised, len(kept))
            self.stats.trees_laid += 1
            self.stats.trees_promised += self.promised
            self.stats.trees_kept += len(kept)
        self.promised = None
        if self.probing:  # a probe that found an agreed token starts the waits over
            self.probing = False
            self.probe_wait = PROBE_FIRST if len(kept) > 1 else min(2 * self.probe_wait, PROBE_LAST)
        self.clock.lap("observe")
        return walked.path, kept

    def context(self) -> DecodeContext:
        request = self.request
        return DecodeContext(tokens=request.tokens, prompt_length=len(request.prompt_ids),
                             vocab_size=self.drafter.vocab_size, eos_token_ids=request.eos_ids,
                             tokenizer=self.drafter.tokenizer, prediction=request.prediction)

    def _draws(self, sampler: Sampler, logits: torch.Tensor, past: int) -> Callable[[int], int]:
        """The target's token at a tree node's row (the row at depth d predicts position past + 1 + d).

        Off the CPU every tree row is warped and drawn in one batch and read back once, so the walk
        waits on the device once, not once per drawn token; on the CPU a read costs nothing and each
        row off the path would cost a softmax over the vocabulary, so only the walked rows are drawn.
        Either way a row's token is the one the seeded autoregressive sampler draws there.
        """
        tree = self.tree
        assert tree is not None
        if not self.drafter.draw_all_rows and logits.device.type == "cpu":
            return lambda node: sampler.draw(logits[node], past + 1 + int(tree.depths[node]))
        drawn = sampler.draw_rows(logits[: tree.size], (past + 1 + tree.depths).tolist()).cpu().numpy()
        return lambda node: int(drawn[node])

    def _rows_that_pay(self, auxiliary: list[tuple[str, AuxiliaryRows]],
                       planner: BudgetPlanner | None) -> list[tuple[str, AuxiliaryRows]]:
        """The auxiliary rows worth their time this cycle by the cost curve (``GooseConfig.price_rows``).

        A source's rows are valued by the tokens it contributes a cycle; rows that do not pay still
        ride once every ``probe_every`` cycles, so the contribution keeps being measured.
        """
        config = self.drafter.config
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
    past the model's last position cannot ride, nor more rows than the pass has room for (a slot holds
    every row of its pass)."""
    fitting, rows = [], 0
    for name, offered in auxiliary:
        count = int(offered.tokens.shape[0])
        if rows + count <= room and (count == 0 or int(offered.position_offsets.max()) <= room):
            fitting.append((name, offered))
            rows += count
    return fitting


def _split_auxiliary(auxiliary: list[tuple[str, Any]], predictions: Any) -> dict[str, Any]:
    """Per source, its slice of the auxiliary rows' predictions (in pass order)."""
    split, start = {}, 0
    for name, rows in auxiliary:
        count = int(rows.tokens.shape[0])
        split[name] = predictions[start : start + count]
        start += count
    return split


class _PhaseClock:
    """Accumulates seconds per cycle phase into ``stats.profile`` (no-op unless profiling)."""

    def __init__(self, stats: GenerationStats | None) -> None:
        self.stats = stats
        self.last = time.perf_counter()

    def start(self) -> float:
        """A phase begins now (what passed since the last lap was another row's, or the consumer's)."""
        self.last = time.perf_counter()
        return self.last

    def lap(self, phase: str) -> None:
        if self.stats is not None:
            now = time.perf_counter()
            self.stats.profile[phase] += now - self.last
            self.last = now
