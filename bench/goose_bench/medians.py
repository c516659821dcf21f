"""The bench's two medians, written once: of measured values, and the run in the middle.

Imports nothing beyond the standard library, so the vLLM runner (run under the vLLM environment's
interpreter, goose_bench on its path) takes them from here too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from statistics import median
from typing import TypeVar

Item = TypeVar("Item")


def median_of(values: Iterable[float | None]) -> float | None:
    """The median of the values present (None: not measured), None when none is."""
    present = [value for value in values if value is not None]
    return median(present) if present else None


def middle_by(items: Sequence[Item], key: Callable[[Item], float]) -> Item:
    """The item with the median ``key`` (the lower of the two middles of an even count): of a method's repeated
    runs, the one a table reports, a real run rather than an average of two."""
    return sorted(items, key=key)[(len(items) - 1) // 2]
