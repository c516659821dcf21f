"""Noticing, in O(1) per cycle, a context that does not continue the one a source has indexed.

Within a request the decoder's context only grows by appending, so a source that indexes it
incrementally reads only the new tokens each cycle. A context that is not a continuation (a new
request whose ``goose_reset`` was skipped, say: a source used outside the decoder) must start a
fresh index, or the old one would draft from text that is not there. Comparing both ends of the
indexed part catches that at constant cost; an edit in the middle of the context would not be
caught, and the decoder never makes one.
"""

from __future__ import annotations

import numpy as np

FINGERPRINT = 16  # tokens compared at each end of the indexed context


class ContextFingerprint:
    """The first and last tokens of the context indexed so far, and its length."""

    def __init__(self) -> None:
        self.length = 0
        self._head: list[int] = []
        self._tail: list[int] = []

    def clear(self) -> None:
        self.length, self._head, self._tail = 0, [], []

    def record(self, indexed: np.ndarray) -> None:
        """Remember ``indexed``: the whole context indexed so far."""
        self.length = indexed.shape[0]
        self._head = indexed[:FINGERPRINT].tolist()
        self._tail = indexed[max(0, self.length - FINGERPRINT) :].tolist()

    def continued_by(self, tokens: np.ndarray) -> bool:
        """Whether ``tokens`` extends the recorded context (its ends agree; short lists beat NumPy calls here)."""
        return (
            tokens.shape[0] >= self.length
            and tokens[: len(self._head)].tolist() == self._head
            and tokens[self.length - len(self._tail) : self.length].tolist() == self._tail
        )
