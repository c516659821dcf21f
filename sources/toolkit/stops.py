"""Where a draft must end: before the first stop token (EOS), a document end or an id the model lacks.

Drafting EOS never raises the yield: when every token before it is accepted, the target's bonus
token is that same EOS for free, so the EOS node would only cost a verification row. And what
follows an EOS or a document end (the next chat turn, the next file) is not a continuation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def before_eos(tokens: Sequence[int], eos: frozenset[int]) -> Sequence[int]:
    """``tokens`` up to (not including) the first EOS: one copied continuation, cut."""
    if eos.isdisjoint(tokens):  # the common case, decided in C
        return tokens
    for position, token in enumerate(tokens):
        if token in eos:
            return tokens[:position]
    return tokens


def cut_at_stops(rows: np.ndarray, eos: frozenset[int], vocab_size: int) -> np.ndarray:
    """Each row of continuations (int64 [k, L]) ended (-1 from there on) at its first negative entry (a
    document end), EOS, or id outside the vocabulary ``[0, vocab_size)``: many continuations, cut at once."""
    stop = (rows < 0) | (rows >= vocab_size)
    for token in eos:  # one or two ids: comparisons beat np.isin's sort
        stop |= rows == token
    return np.where(np.cumsum(stop, axis=1) > 0, -1, rows)
