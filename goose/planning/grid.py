"""Estimates as the planning caches key them: checked probabilities, rounded to the planning grid.

The optimisers are cached on acceptance estimates rounded to
:data:`goose.contract.acceptance.ALLOCATION_STEP` (planners call them every cycle); a per-depth
estimate is a tuple whose last value repeats past its end.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from goose.contract.acceptance import ALLOCATION_STEP, quantize, quantize_all


def probability(value: float, name: str) -> float:
    """``value`` as a float, or a ValueError naming ``name`` when it is not a probability in [0, 1]."""
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value}")
    return value


def probabilities(values: object, name: str) -> np.ndarray:
    """:func:`probability` for a sequence or array at once, as a flat float array."""
    array = np.asarray(values, dtype=np.float64).ravel()
    outside = array[~((array >= 0.0) & (array <= 1.0))]  # NaN counts as outside
    if outside.size:
        probability(outside[0], name)  # raises, with the one message
    return array


def grid(value: float) -> float:
    """An estimate on the planning grid (the caches' key)."""
    return quantize(value, ALLOCATION_STEP)


def rounded(acceptance: float | Sequence[float]) -> tuple[float, ...]:
    """Per-depth acceptance as a rounded tuple (a scalar is one depth that repeats)."""
    if isinstance(acceptance, float | int):  # the hot path: one estimate per source, every cycle
        return (grid(probability(acceptance, "acceptance")),)
    values = probabilities(acceptance, "acceptance")  # per depth: one array operation, not a loop
    if not values.size:
        raise ValueError("acceptance needs at least one value")
    return tuple(quantize_all(values, ALLOCATION_STEP))


def per_depth(acceptance: tuple[float, ...], length: int) -> np.ndarray:
    """Per-depth acceptance for depths 1..length (the last value repeats)."""
    values = list(acceptance[:length]) + [acceptance[-1]] * max(0, length - len(acceptance))
    return np.array(values, dtype=np.float64)
