"""Acceptance estimates: one shared estimator per source, and the one place estimates are clamped and rounded.

Every source's estimate is kept by the decoder, not by the source: after each verification the
decoder counts the source's tested and accepted tree nodes (a node is tested when its parent was
accepted) and moves that source's :class:`AcceptanceEstimate` by an EMA step. The estimator is made
for the name the source was registered under, so a source registered twice under two names has two
estimates, and no source ever has to spell its own name. Sources read their estimate (the
``acceptance`` argument of ``goose_propose``); planners rank sources by it and the automatic budget
sizes trees by it.

Planning caches its optimisations on estimates rounded to a grid, so that a cached answer serves
most cycles. :func:`quantize` is that rounding, used with the step each cache needs.
"""

from __future__ import annotations

import math

import numpy as np

# Grid steps of the planning caches: the budget choice is re-evaluated per 0.02 of an estimate (a
# coarse key, since it is searched over many budgets), the tree allocations per 0.01.
BUDGET_STEP = 0.02
ALLOCATION_STEP = 0.01


def clamp_probability(value: object) -> float:
    """``value`` as a probability in [0, 1]; anything that is not a finite number counts as 0."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return min(1.0, max(0.0, number)) if math.isfinite(number) else 0.0


def clamp_probabilities(values: np.ndarray) -> np.ndarray:
    """:func:`clamp_probability` for every entry of a float array at once."""
    return np.where(np.isfinite(values), np.clip(values, 0.0, 1.0), 0.0)


def quantize(value: float, step: float) -> float:
    """``value`` clamped to [0, 1] and rounded to a multiple of ``step`` (exact decimals such as 0.07)."""
    return round(round(clamp_probability(value) / step) * step, _decimals(step))


def quantize_all(values: np.ndarray, step: float) -> list[float]:
    """:func:`quantize` for every entry of a float array at once (per-depth estimates, every cycle)."""
    return np.round(np.round(clamp_probabilities(values) / step) * step, _decimals(step)).tolist()


def _decimals(step: float) -> int:
    return max(0, -math.floor(math.log10(step)) + 1)


class AcceptanceEstimate:
    """A source's per-token acceptance rate: an EMA of accepted / tested draft nodes, one step per cycle.

    A cycle that tested none of the source's nodes says nothing about it and leaves the estimate
    where it is. Estimates live as long as the decoder: they describe how well a source does for
    this model and kind of task, not one prompt.
    """

    def __init__(self, name: str, initial: float, coefficient: float) -> None:
        self.name = name
        self.rate = clamp_probability(initial)
        self.coefficient = coefficient
        self.cycles = 0  # cycles that tested this source's nodes
        self.contribution = 0.0  # running mean of the source's accepted tokens per cycle, every cycle counted

    def observe(self, tested: int, accepted: int) -> None:
        """Fold in one cycle: ``tested`` of the source's nodes were tested, ``accepted`` of them accepted."""
        self.contribution += 0.1 * (accepted - self.contribution)
        if tested <= 0:
            return
        self.rate += self.coefficient * (accepted / tested - self.rate)
        self.cycles += 1

    def __repr__(self) -> str:
        return f"AcceptanceEstimate({self.name!r}, rate={self.rate:.3f}, cycles={self.cycles})"
