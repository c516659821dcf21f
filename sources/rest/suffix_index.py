"""A suffix array over token ids and the searches REST needs: the longest matching suffix, its continuations.

Documents are concatenated with :data:`SEPARATOR` (-1) after each one; no query contains it, so a
match never spans two documents and every read past a document's end stops there. The suffix array
comes from libdivsufsort (``pydivsufsort``); its entries are the starts of every non-separator
suffix in lexicographic order (values compare as signed integers, so the separator sorts first).
All searches are vectorised: the context's last ``min_span..max_span`` tokens are searched
together, in one binary search over the suffix array in which every probe compares at most
``max_span`` tokens, and no suffix is ever materialised. The arrays may be memory-mapped: every
operation reads only the entries it needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from pydivsufsort import divsufsort

SEPARATOR = -1  # between documents; never part of a query, so matches stay inside one document


class DatastoreError(ValueError):
    """A datastore or index that is missing, malformed, or built for another tokenizer; the message says what to do."""


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Start positions of all suffixes of ``tokens`` in lexicographic order (int32, or int64 past 2**31).

    Values compare as signed integers (so :data:`SEPARATOR` sorts first) and a suffix sorts before
    its own extensions.
    """
    tokens = np.ascontiguousarray(tokens)
    n = tokens.shape[0]
    index_dtype = np.int32 if n < 2**31 - 1 else np.int64
    if n <= 1:
        return np.zeros(n, dtype=index_dtype)
    # pydivsufsort sorts an int array as big-endian bytes of (value - min) after flipping the sign
    # bit: lexicographic byte order is numeric order, and it keeps only the suffixes that start on a
    # token boundary
    values = tokens if tokens.dtype in (np.int32, np.int64) else tokens.astype(np.int64)
    return np.asarray(divsufsort(values), dtype=index_dtype)


@dataclass(frozen=True)
class Match:
    """The longest context suffix found: its length and the suffix-array range [lo, hi) of its occurrences."""

    span: int
    lo: int
    hi: int

    @property
    def count(self) -> int:
        return self.hi - self.lo


class SuffixIndex:
    """Token ids (documents separated by -1, ending with -1) and their non-separator suffixes, sorted.

    The arrays may be memory-mapped; every operation reads only the entries it needs.
    """

    def __init__(self, tokens: np.ndarray, suffixes: np.ndarray) -> None:
        if tokens.ndim != 1 or suffixes.ndim != 1:
            raise DatastoreError("datastore arrays must be one-dimensional")
        if tokens.shape[0] and int(tokens[-1]) != SEPARATOR:
            raise DatastoreError("datastore tokens must end with the separator -1")
        self.tokens = tokens
        self.suffixes = suffixes

    @classmethod
    def from_documents(cls, documents: Iterable[Sequence[int] | np.ndarray]) -> SuffixIndex:
        """An in-memory index over token sequences (each becomes one document)."""
        tokens = join_documents(documents)
        return cls(tokens, non_separator_suffixes(tokens))

    def __len__(self) -> int:
        """Number of searchable suffixes (non-separator tokens)."""
        return int(self.suffixes.shape[0])

    def ranges(self, patterns: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Suffix-array ranges [lo, hi) of several patterns at once.

        ``patterns`` int64 [S, L] (row i's first ``lengths[i]`` tokens are the pattern). Lower and
        upper bounds of all rows are found by one binary search that moves 2S cursors per step;
        each probe gathers the L tokens at the probed suffix and compares them with the pattern:
        about log2(len) steps of a few small NumPy ops, whatever the corpus size.
        """
        count = patterns.shape[0]
        m, n = len(self), int(self.tokens.shape[0])
        if count == 0 or m == 0:
            return np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
        width = patterns.shape[1]
        pattern = np.concatenate([patterns, patterns]).astype(np.int64)
        in_pattern = np.arange(width)[None, :] < np.concatenate([lengths, lengths])[:, None]
        upper = np.repeat([False, True], count)  # second half: first suffix *greater* than the pattern
        rows = np.arange(2 * count)
        lo = np.zeros(2 * count, dtype=np.int64)
        hi = np.full(2 * count, m, dtype=np.int64)
        offsets = np.arange(width)
        for _ in range(m.bit_length() + 1):
            active = lo < hi
            if not active.any():
                break
            mid = (lo + hi) >> 1
            starts = np.asarray(self.suffixes[np.minimum(mid, m - 1)], dtype=np.int64)
            # reads past the corpus end are clipped to its last token, the separator: a pattern
            # never contains it, so such a probe compares as smaller, as the shorter suffix should
            window = np.asarray(self.tokens[np.minimum(starts[:, None] + offsets, n - 1)], dtype=np.int64)
            differ = (window != pattern) & in_pattern
            first = differ.argmax(axis=1)
            smaller = differ.any(axis=1) & (window[rows, first] < pattern[rows, first])
            go_right = smaller | (upper & ~differ.any(axis=1))
            lo = np.where(active & go_right, mid + 1, lo)
            hi = np.where(active & ~go_right, mid, hi)
        return lo[:count], lo[count:]

    def longest_match(self, context: np.ndarray, min_span: int, max_span: int) -> Match | None:
        """The longest suffix of ``context`` (``max_span`` down to ``min_span`` tokens) that occurs here."""
        longest = min(max_span, int(context.shape[0]))
        if longest < min_span or len(self) == 0:
            return None
        tail = np.asarray(context[-longest:], dtype=np.int64)
        spans = np.arange(longest, min_span - 1, -1)
        # row for span s: the last s tokens of the context, left-aligned, padded (the padding is masked)
        patterns = np.zeros((spans.shape[0], longest), dtype=np.int64)
        for row, span in enumerate(spans):  # at most max_span rows of a few tokens
            patterns[row, :span] = tail[longest - span :]
        lo, hi = self.ranges(patterns, spans)
        found = np.flatnonzero(hi > lo)
        if found.shape[0] == 0:
            return None
        best = int(found[0])  # spans are longest first
        return Match(int(spans[best]), int(lo[best]), int(hi[best]))

    def continuations(self, match: Match, limit: int, length: int) -> np.ndarray:
        """The ``length`` tokens after up to ``limit`` occurrences of ``match``: int64 [k, length].

        When there are more than ``limit`` occurrences they are sampled at an even stride over the
        range: the range is sorted by what follows, so its first ``limit`` entries would be a
        biased sample (only the lexicographically smallest continuations). Reads that reach a
        document end show the separator (-1); callers cut each row at its first one.
        """
        count = match.count
        if count <= 0:
            return np.zeros((0, length), dtype=np.int64)
        if count > limit:
            picked = match.lo + (np.arange(limit, dtype=np.int64) * count) // limit
        else:
            picked = np.arange(match.lo, match.hi, dtype=np.int64)
        starts = np.asarray(self.suffixes[picked], dtype=np.int64) + match.span
        last = int(self.tokens.shape[0]) - 1
        return np.asarray(self.tokens[np.minimum(starts[:, None] + np.arange(length), last)], dtype=np.int64)


def join_documents(documents: Iterable[Sequence[int] | np.ndarray]) -> np.ndarray:
    """Documents concatenated, each followed by the separator, as int32."""
    parts: list[np.ndarray] = []
    separator = np.array([SEPARATOR], dtype=np.int32)
    for document in documents:
        array = np.asarray(document, dtype=np.int64)
        if array.shape[0] == 0:
            continue
        if int(array.min()) < 0 or int(array.max()) >= 2**31 - 1:
            raise DatastoreError("token ids must be in [0, 2**31 - 1)")
        parts += [array.astype(np.int32), separator]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def non_separator_suffixes(tokens: np.ndarray) -> np.ndarray:
    """The suffix array without the suffixes that start at a separator (they never match a query)."""
    order = suffix_array(tokens)
    return order[tokens[order] != SEPARATOR]  # suffixes starting at a separator never match a query


__all__ = ["DatastoreError", "Match", "SuffixIndex"]
