"""Hardware-aware planning: every row of a verify pass is priced with the device's cost curve.

**Tree size.** Each cycle the decoder asks for the budget n maximising
E[tau(n)] / (t(n + 1 + a) + overhead), where t is the device's measured verify cost curve
(:mod:`goose.planning.cost`), a the auxiliary rows riding in the same pass, E[tau(n)] the expected yield of
the best spine tree of n draft nodes under the sources' current acceptance estimates
(:func:`goose.planning.allocation.best_spine_tree`), and overhead the decoder's own per-cycle time
(drafting, planning, walking), tracked as a running mean. t is what passes really cost now: the
calibrated curve corrected by every pass the decoder runs (:class:`goose.planning.cost.LiveCurve`:
medians, so an outlier moves nothing; a curve measured on a busy machine would otherwise make the
overhead look free, or a quiet one make trees look cheap on a loaded machine). On a GPU t is flat and
this picks the paper's large trees; on a CPU, where width costs, it picks small ones and long chains
only when the context match is trusted.

**No tree where none pays.** Budget 0, the anchor alone (a plain decoding step), is a candidate like
any other: a cycle whose best tree's expected tokens per second do not beat one token per t(1 + a)
lays none (decoding's rule; a pinned planner, a study's, lays the best tree every cycle: a study
measures what the sources draft, and a source never tested would show nothing). So where the curve
is steep (a compute-bound CPU: llama.cpp's pass over 16 tokens costs 5.9 times one on the AVX2 EPYC)
and the drafts are weak, Goose decodes as plainly as the engine does, paying only its drafting; the
decoder still lays a one-node probe now and then (:meth:`goose.cycle.drafting.RowCycle.probed`), since
an estimate moves only when a draft is tested.

**Promises kept.** A source's estimates may promise more than its drafts give (a draft's own
``depth_acceptance`` is the source's word, and context matching's copy-depth estimates carry over
from earlier requests of another kind). So every tree's expected yield, as planned, is set against
the tokens it really gave, per the source that led it (its spine, else its branches):
:class:`Trust`, the ratio of the two over the recent trees, scales the extra tokens the planner
expects of that source's next trees (never above what the source says). A source whose trees keep
losing gets none where they would not pay at its real yield; its probes keep measuring it. A pinned
planner trusts every estimate as given (a study's figures follow from the drafts alone).

**Auxiliary rows** (a source's rows that ride in the pass without being drafted, such as
Lookahead's Jacobi window) are priced by the same rule: they ride when the tokens per second of a
pass with them, counting the source's measured contribution (its accepted tokens per cycle), beat
the tokens per second without them. A source whose rows do not pay still drafts from what it has,
and its rows ride now and then (``probe_every`` cycles) so that its contribution stays measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np

from goose.contract.acceptance import BUDGET_STEP, quantize, quantize_all
from goose.contract.candidates import CandidatePool, without_trailing_repeats
from goose.planning.cost import BatchCosts, CostCurve, LiveCurve
from goose.planning.spine_tree import best_spine_tree, spine_yields

TRUST_RATE = 0.2  # the EMA step of Trust's sums: about a source's last five trees count
TRUST_STEP = 0.05  # the cache grid of Trust.scale
CANDIDATE_BUDGETS = (1, 2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128)

# (pool, candidate budgets) -> the spine the topology lays for each budget, or None (the best split)
SpineLengths = Callable[[CandidatePool, tuple[int, ...]], tuple[int, ...] | None]


class Trust:
    """How far a source's trees keep their promise: the tokens beyond the anchor's that the trees it led gave,
    over those the planner expected of them (running sums, one step a tree), capped at 1."""

    def __init__(self) -> None:
        self.promised = self.delivered = 1.0  # a source starts trusted as it says

    def observe(self, promised: float, delivered: float) -> None:
        """One tree: ``promised`` extra tokens expected of it (E[tau] - 1, as planned), ``delivered`` kept (tau - 1)."""
        self.promised += TRUST_RATE * (promised - self.promised)
        self.delivered += TRUST_RATE * (delivered - self.delivered)

    @property
    def scale(self) -> float:
        return min(1.0, self.delivered / self.promised) if self.promised > 0 else 1.0


class BudgetPlanner:
    """Chooses a draft-tree budget from the cost curve and the current acceptance estimates."""

    def __init__(self, curve: CostCurve, max_budget: int = 128, max_depth: int = 6,
                 batch_curve: Callable[[int], CostCurve] | None = None, pinned: bool = False) -> None:
        self.curve = curve  # what rows cost now: the calibrated curve, corrected by the passes observed
        self._live = LiveCurve(curve)
        self.pinned = pinned  # measured times move nothing: the budgets follow from the curve and the drafts
        self._batch_curve = batch_curve  # batch size -> its calibrated curve (None: batches priced on ``curve``)
        self._batches: BatchCosts | None = None  # the batched passes' curves, made when a split first needs them
        self.max_depth = max_depth
        # the usual budgets, and those whose tree (with the anchor) is a size the curve was measured at: where an
        # engine's kernels take rows in blocks its curve is measured at every size, and a row more may cost less
        landing = {size - 1 for size in curve.sizes if size > 1}
        self.candidates = tuple(sorted(n for n in {*CANDIDATE_BUDGETS, *landing} if n <= max_budget)) or (1,)
        self.overhead_s = 0.0005
        self._overhead_key = 0.0  # overhead_s in units of one token's verify, as the choice's cache key
        self.tree_rows = 1.0  # running means of the tree's rows and of the tokens a cycle yields
        self.tokens = 1.0
        self._choose = lru_cache(maxsize=4096)(self._best)
        self._yields = lru_cache(maxsize=4096)(self._spine_yields)
        self.trust: dict[str, Trust] = {}  # per source that led a tree: how far its promises held
        self.promises: list[np.ndarray] = []  # the last split's pools: each one's E[tau] per candidate, as planned

    def observe_overhead(self, seconds: float) -> None:
        """Fold one cycle's non-verify time into the running mean (pinned: kept at its starting value)."""
        if not self.pinned:
            self.overhead_s += 0.1 * (seconds - self.overhead_s)

    def observe_pass(self, requests: int, rows: int, seconds: float) -> None:
        """Fold one real pass of ``requests`` requests and ``rows`` rows in all into the curve such a pass is priced by.

        One request's is this planner's curve: one calibrated while the machine was busier (or quieter)
        than now, or at another context length, is corrected by the medians of the passes observed
        (:class:`goose.planning.cost.LiveCurve`), and the cached choices are made again when it moved.
        Several requests' curves are corrected point by point
        (:meth:`goose.planning.cost.BatchCosts.observe`) once a split has used them.
        """
        if self.pinned:
            return
        if requests == 1:
            if self._live.observe(rows, seconds):
                self.curve = self._live.curve
                self._choose.cache_clear()
        elif self._batches is not None:
            self._batches.observe(requests, rows, seconds)

    def contradicted(self) -> CostCurve | None:
        """The corrected curve, once the passes have contradicted the calibrated one (then taken as the new
        calibration: said once); None otherwise, and always for a pinned planner."""
        if self.pinned or not self._live.contradicted():
            return None
        self._live = LiveCurve(self.curve)
        return self.curve

    @property
    def scale(self) -> float:
        """What passes really cost over what the calibration said: the median of the recent ones."""
        return self._live.scale

    def observe_cycle(self, tree_rows: int, tokens: int) -> None:
        """Fold one cycle's tree size (anchor included) and yield into the running means rows are priced by."""
        self.tree_rows += 0.1 * (tree_rows - self.tree_rows)
        self.tokens += 0.1 * (tokens - self.tokens)

    def observe_tree(self, source: str, promised: float, kept: int) -> None:
        """One tree that ``source``'s draft led: ``promised`` its E[tau] as planned (:meth:`promise`), ``kept`` the
        tokens it gave, bonus included. A pinned planner keeps no account: it trusts every estimate as given."""
        if not self.pinned:
            self.trust.setdefault(source, Trust()).observe(promised - 1.0, kept - 1.0)

    def trusted(self, pool: CandidatePool) -> float:
        """How far the extra tokens expected of ``pool``'s trees are believed: its lead's :class:`Trust` scale,
        on the cache grid (1 for a source that has led no tree yet, and always for a pinned planner)."""
        trust = self.trust.get(lead(pool) or "")
        return 1.0 if trust is None or self.pinned else quantize(trust.scale, TRUST_STEP)

    def promise(self, row: int, budget: int) -> float:
        """The E[tau] the last :meth:`split` expected of row ``row``'s tree at ``budget`` (> 0), as planned."""
        return float(self.promises[row][self.candidates.index(budget)])

    def rows_pay(self, rows: int, contribution: float, other_rows: int = 0) -> bool:
        """Whether ``rows`` auxiliary rows that bring ``contribution`` tokens a cycle are worth their time.

        Compares tokens per second of a typical pass (this decoder's running means of tree rows and
        yield, plus ``other_rows`` already riding) with and without them.
        """
        base = self.tree_rows + other_rows
        without = self.tokens / (float(self.curve(base)) + self.overhead_s)
        with_rows = (self.tokens + contribution) / (float(self.curve(base + rows)) + self.overhead_s)
        return with_rows > without

    def split(self, pools: Sequence[CandidatePool], spine_lengths: SpineLengths, extra_rows: Sequence[int]
              ) -> list[int]:
        """The budgets of one verify pass's rows, however many: each row's pool and ``extra_rows``, its auxiliary
        rows riding in the pass; ``spine_lengths`` is the topology's hint (``goose_spine_lengths``) of the spine
        it will lay.

        A pass of one request is that request's tree: its budget is :meth:`choose`'s, its pool's best draft
        on the spine and best brancher on the branches, which is what :meth:`divide` gives one row on this
        planner's curve, read from the choice's cache. A pass of several is divided by :meth:`divide` on the
        curve of a pass of that many requests (:class:`goose.planning.cost.BatchCosts`: measured when first
        needed, corrected by :meth:`observe_pass`).
        """
        keys = [self._key(*self._pool_key(pool, spine_lengths)) for pool in pools]
        trusts = [self.trusted(pool) for pool in pools]
        self.promises = [self._yields(*key) for key in keys]
        if len(keys) == 1:
            return [self._decide(keys[0], extra_rows[0], trusts[0])]
        if self._batches is None and self._batch_curve is not None:
            self._batches = BatchCosts(self.curve, self._batch_curve)
        return self.divide([1.0 + trust * (taus - 1.0) for taus, trust in zip(self.promises, trusts, strict=True)],
                           extra_rows, self._batches.curve(len(keys)) if self._batches is not None else None)

    def divide(self, yields: Sequence[np.ndarray], extra_rows: Sequence[int], curve: CostCurve | None = None
               ) -> list[int]:
        """Budgets for the rows of one batched pass: each row's ``yields`` (its best tree's expected tokens at
        every candidate budget), ``extra_rows`` its auxiliary rows; ``curve`` the cost of a pass of that many
        requests over its total rows (default: the single-request curve).

        A batched pass pads every row to the longest, so it costs t(rows x R) for R rows each, whatever
        the shorter ones hold: once R is chosen, a row's nodes up to R are free. With several rows, a
        budget of 0 (the anchor alone: a plain decoding step) is a choice too, since on a device where
        rows cost, batching alone may already use what drafting would. The division picks the
        R whose pass yields the most tokens per second, the rows' summed expected tokens (each row its
        best tree within R) over t(rows x R) plus every row's overhead; each row then takes its best
        budget within R, and a row whose tree could be larger waits for a pass where it pays. For one
        row this is :meth:`choose`'s rule (the best budget, the smallest of equal rates).
        """
        budgets = np.asarray(self.candidates)
        taus = np.stack(yields)  # [rows, c]
        extra = np.asarray(extra_rows, dtype=np.int64)
        rows = taus.shape[0]
        if rows > 1:  # several requests may pass a cycle undrafted (budget 0: the anchor alone, one token)
            budgets = np.concatenate([[0], budgets])
            taus = np.concatenate([np.ones((rows, 1)), taus], axis=1)
        widths = budgets + 1 + int(extra.min())  # every candidate R: some row's budget fills it exactly
        # row i's best budget within each R: the largest candidate with budget + 1 + extra_i <= R (else the least)
        fits = budgets[None, None, :] + 1 + extra[:, None, None] <= widths[None, :, None]  # [rows, R, c]
        chosen = np.where(fits.any(axis=2), fits.shape[2] - 1 - np.argmax(fits[:, :, ::-1], axis=2), 0)  # [rows, R]
        need = (budgets[chosen] + 1 + extra[:, None]).max(axis=0)  # the pass's real width for each R
        totals = np.take_along_axis(taus, chosen, axis=1).sum(axis=0)
        cost = (curve if curve is not None else self.curve)(rows * need) + self.overhead_s * rows
        rates = totals / cost
        best = int(np.argmax(rates))  # the first of equal rates, the narrowest pass
        return [int(budgets[c]) for c in chosen[:, best]]

    def _pool_key(self, pool: CandidatePool, spine_lengths: SpineLengths
                  ) -> tuple[float | Sequence[float], int, float, tuple[int, ...] | None]:
        spine = pool.drafting[0] if pool.drafting else None
        branch = pool.branching[0] if pool.branching else None
        branch_acceptance = branch.acceptance if branch else 0.0
        if spine is None or spine.draft is None:
            return 0.0, 0, branch_acceptance, None
        return spine.spine_acceptance, len(spine.draft), branch_acceptance, spine_lengths(pool, self.candidates)

    def choose(self, spine_acceptance: float | Sequence[float], spine_length: int, branch_acceptance: float,
               spine_caps: tuple[int, ...] | None = None, extra_rows: int = 0, trust: float = 1.0) -> int:
        """Budget for a cycle whose best draft has ``spine_length`` tokens (0: no draft).

        ``spine_acceptance``: one rate, or per spine depth (the last value repeats).
        ``spine_caps``: per candidate budget, the spine length the topology will really lay (its
        ``goose_spine_lengths`` hook); without them each budget's best split is assumed. ``trust``: the share of
        the extra tokens expected that is believed (:meth:`trusted`).
        """
        return self._decide(self._key(spine_acceptance, spine_length, branch_acceptance, spine_caps), extra_rows, trust)

    def _decide(self, key: tuple[tuple[float, ...], tuple[int, ...], float], extra_rows: int, trust: float) -> int:
        """:meth:`choose` on a cache key (:meth:`_key`) already made."""
        overhead = self.overhead_s / self.curve.seconds[0]
        if abs(overhead - self._overhead_key) > 0.1:  # re-key on a real move, not on noise around a grid line
            self._overhead_key = round(overhead, 1)
        return self._choose(*key, self._overhead_key, extra_rows, trust)

    def _key(self, spine_acceptance: float | Sequence[float], spine_length: int, branch_acceptance: float,
             spine_caps: tuple[int, ...] | None) -> tuple[tuple[float, ...], tuple[int, ...], float]:
        caps = spine_caps if spine_caps is not None else (spine_length,) * len(self.candidates)
        return (_per_depth_key(spine_acceptance, spine_length), tuple(min(cap, spine_length) for cap in caps),
                _bucket(branch_acceptance))

    def expected_rate(self, budget: int, spine_acceptance: float | Sequence[float], spine_length: int,
                      branch_acceptance: float, extra_rows: int = 0) -> float:
        """Expected tokens per second of a cycle with ``budget`` draft nodes and a spine of at most
        ``spine_length`` of them (``spine_acceptance``: one rate or per depth), with ``extra_rows``
        auxiliary rows in the same pass."""
        tau = best_spine_tree(spine_acceptance, branch_acceptance, budget, self.max_depth,
                              max_spine=spine_length).expected_tau
        return tau / (float(self.curve(budget + 1 + extra_rows)) + self.overhead_s)

    def _spine_yields(self, spine_acceptance: tuple[float, ...], spine_caps: tuple[int, ...],
                      branch_acceptance: float) -> np.ndarray:
        # every candidate budget's best tree in one pass (what expected_rate works out for one budget)
        return spine_yields(spine_acceptance, branch_acceptance, self.candidates, spine_caps, self.max_depth)

    def _best(self, spine_acceptance: tuple[float, ...], spine_caps: tuple[int, ...], branch_acceptance: float,
              overhead_bucket: float, extra_rows: int, trust: float) -> int:
        del overhead_bucket  # part of the cache key only: a new overhead level re-evaluates the choice
        taus = 1.0 + trust * (self._yields(spine_acceptance, spine_caps, branch_acceptance) - 1.0)
        rates = taus / (self.curve(np.asarray(self.candidates) + 1 + extra_rows) + self.overhead_s)
        best = int(np.argmax(rates))  # the first of equal rates, the smallest budget
        if self.pinned:  # a study's decoder: it lays the best tree every cycle, to measure what the sources draft
            return self.candidates[best]
        plain = 1.0 / (float(self.curve(1 + extra_rows)) + self.overhead_s)  # budget 0: the anchor, one token
        return self.candidates[best] if rates[best] > plain else 0


def lead(pool: CandidatePool) -> str | None:
    """The source a pool's tree is led by: the most trusted one with a draft (the spine), else the most trusted
    brancher; None when no source drafts."""
    leading = pool.drafting or pool.branching
    return leading[0].name if leading else None


def _bucket(value: float) -> float:
    return quantize(value, BUDGET_STEP)


def _per_depth_key(acceptance: float | Sequence[float], length: int) -> tuple[float, ...]:
    """Per-depth estimates on the cache grid, cut to the spine's length, trailing repeats trimmed."""
    if isinstance(acceptance, float | int):
        return (_bucket(acceptance),)
    values = np.asarray(acceptance, dtype=np.float64)[: max(1, length)]
    return without_trailing_repeats(quantize_all(values, BUDGET_STEP) or [0.0])
