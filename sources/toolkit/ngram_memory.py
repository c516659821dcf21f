"""A memory of token sequences, searchable by the context's suffix: earlier requests plus the current one.

SuffixDecoding (Oliaro et al., 2024) keeps a suffix tree over the outputs of earlier requests
and another over the current prompt and output, finds the longest suffix of the context that
occurs in them, and drafts from the counts of what followed it. This module is that memory for
a Python process on a small CPU, where the per-cycle search must cost next to nothing and the
memory must stay bounded. Its layout:

* **Suffix tables instead of a suffix tree.** For every n in a ladder of suffix lengths
  (``sizes``, e.g. 32, 24, ..., 3, 2), each position of the text is indexed under the hash of
  the n tokens before it: its *continuation start*. The occurrences of the context's last n
  tokens are the entries under that key, and the number of entries is the count a suffix-tree
  node at depth n would hold. Drafting needs no more of the tree than that: the continuations
  read from the text at those starts, merged into a frequency trie, are the tree's subtree below
  the matched node, with the same counts (``goose.sources.toolkit.frequency_trie`` does the merge).
  The match length is one of the ``sizes``, not any length as in a suffix tree; the ladder is
  dense where matches are short and sparse where they are long, where one more token of match
  changes little.
* **Earlier requests: sorted tables.** Finished requests are *documents* in one token store
  (each followed by a separator, -1, so no continuation runs into the next document). Per size
  the table is a sorted uint64 array of keys with the global continuation starts beside it, so
  a lookup is one ``np.searchsorted`` per size, whatever the memory's size (a binary search over
  a suffix array, as ``goose.sources.rest.suffix_index.SuffixIndex`` does for the static REST corpus, costs
  log2(N) rounds of NumPy calls per cycle instead, and must be rebuilt to take in a document).
  A new document's keys are computed vectorised and merged in with ``np.insert``; within one key
  the starts stay in text order, so the newest occurrences are the last entries.
* **One archive, many requests.** The earlier requests are a :class:`RequestArchive`, which
  several memories may share (one per request running at once, as a serving engine's drafters
  are): a request one of them remembers is searched by all. The current request stays each
  memory's own.
* **Bounded memory, oldest first out.** ``capacity`` is the number of document tokens kept; a
  new document evicts the oldest ones until the rest fit (a document longer than the capacity
  keeps its last ``capacity`` tokens). Eviction drops the evicted documents' entries by a
  mask over each table (starts are global positions that never change, so nothing is renumbered)
  and the store's head; memory is ``len(sizes)`` table entries (16 bytes) and one token per token kept.
* **The current request: hash chains.** The request's tokens (prompt, then output) only grow by
  appending, so each new position is indexed once, under the same keys: per size a dict from key
  to the newest start and a list holding, for every start, the previous start with the same key
  (zlib's head/next chains). The keys come from prefix hashes (one multiply-add per token), so a
  position costs one dict update per size, and no per-key container is made (thousands of small
  lists would cost the garbage collector more than the indexing). Only continuation starts up to
  the last token are indexed: the context's own suffix never matches itself.
* **Hashes.** A key is the n-gram's polynomial hash mod 2**64 with an odd base, computed by
  Horner's rule over the n-gram (vectorised, for documents) or as a difference of prefix hashes
  (incremental, for the current request), which are equal mod 2**64. A collision (about
  (entries / 2**64) per lookup) can only make a draft wrong, never the output: verification
  decides what is accepted.
* **Persistence.** :meth:`save` writes the documents (not the tables, which :meth:`load`
  rebuilds) to one ``.npz`` file with a format version and the caller's metadata, atomically.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from goose.sources.toolkit.fingerprint import ContextFingerprint

FORMAT = "goose-ngram-memory/1"
SEPARATOR = -1  # after every document in the store, and past the end of the current request
HASH_BASE = 0x9E3779B97F4A7C15  # odd, so the hash of an n-gram mixes every token into all 64 bits
_MASK = (1 << 64) - 1


class MemoryFileError(ValueError):
    """A memory file that is missing pieces, of another format, or corrupt; the message says which."""


def ngram_keys(tokens: np.ndarray, n: int) -> np.ndarray:
    """uint64 hash keys of every n-gram of ``tokens``: entry i is the key of ``tokens[i:i + n]``."""
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(tokens).astype(np.uint64), n)
    keys = np.zeros(windows.shape[0], dtype=np.uint64)
    base = np.uint64(HASH_BASE)
    for column in range(n):  # Horner's rule; uint64 arithmetic wraps mod 2**64
        keys = keys * base + windows[:, column]
    return keys


@dataclass(frozen=True)
class Match:
    """The longest indexed suffix of the current request: its length and where it occurred.

    ``live``: the newest continuation starts in the current request (at most the search's
    ``limit``), oldest first; ``lo:hi``: the range of the memory's table for ``size`` holding the
    earlier requests' occurrences (oldest first).
    """

    size: int
    live: np.ndarray
    lo: int
    hi: int

    @property
    def count(self) -> int:
        return int(self.live.shape[0]) + self.hi - self.lo


class RequestArchive:
    """Earlier requests: documents in one token store and, per suffix size, a sorted table of their keys.

    Bounded by ``capacity`` document tokens (oldest documents evicted first). One archive may be
    shared by several :class:`NgramMemory` objects in one thread: what one remembers, all search.
    """

    def __init__(self, sizes: Sequence[int], capacity: int) -> None:
        if not sizes or min(sizes) < 1:
            raise ValueError(f"sizes must be suffix lengths >= 1, got {tuple(sizes)}")
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0 tokens, got {capacity}")
        self.sizes = tuple(sorted(set(sizes), reverse=True))
        self.capacity = capacity
        # documents in one store, global positions [base, next) of which are kept
        self.documents: deque[tuple[int, np.ndarray]] = deque()  # (global start, tokens)
        self.stored = 0  # tokens of the documents kept (separators not counted)
        self.store = np.zeros(0, dtype=np.int64)
        self.base = 0  # global position of store[0]
        self.next_start = 0  # global position where the next document starts
        self.keys = {n: np.zeros(0, dtype=np.uint64) for n in self.sizes}
        self.starts = {n: np.zeros(0, dtype=np.int64) for n in self.sizes}

    def remember(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Add a finished request as one document, then evict the oldest documents beyond ``capacity``."""
        self.add_documents([tokens])

    def clear(self) -> None:
        """Forget every document."""
        self.documents.clear()
        self.stored = 0
        self.store = np.zeros(0, dtype=np.int64)
        self.base = self.next_start
        for n in self.sizes:
            self.keys[n], self.starts[n] = self.keys[n][:0], self.starts[n][:0]

    def document_tokens(self) -> list[np.ndarray]:
        """The documents kept, oldest first."""
        return [document for _, document in self.documents]

    def add_documents(self, documents: Iterable[Sequence[int] | np.ndarray]) -> None:
        if self.capacity == 0:
            return
        added: list[tuple[int, np.ndarray]] = []
        for tokens in documents:
            document = np.asarray(tokens, dtype=np.int64)[-self.capacity :]
            if document.shape[0] == 0:
                continue
            if int(document.min()) < 0:
                raise ValueError("token ids must be >= 0")
            added.append((self.next_start, document))
            self.next_start += document.shape[0] + 1  # and the separator
        if not added:
            return
        self.documents.extend(added)
        self.stored += sum(document.shape[0] for _, document in added)
        pieces = [self.store]
        for _, document in added:
            pieces += [document, np.array([SEPARATOR])]
        self.store = np.concatenate(pieces)
        self._evict()  # before indexing: a long batch (a loaded file) indexes only what it keeps
        kept = [(start, document) for start, document in added if start >= self.base]
        for n in self.sizes:
            # a document of m tokens has continuation starts n..m-1, after the n-grams of document[:-1]
            keys = [ngram_keys(document[:-1], n) for _, document in kept if document.shape[0] > n]
            if not keys:
                continue
            starts = np.concatenate([start + n + np.arange(document.shape[0] - n)
                                     for start, document in kept if document.shape[0] > n])
            new_keys = np.concatenate(keys)
            order = np.argsort(new_keys, kind="stable")  # stable: text order within a key
            new_keys, starts = new_keys[order], starts[order]
            # to the right of equal keys: the new starts are later than every kept one
            at = np.searchsorted(self.keys[n], new_keys, side="right")
            self.keys[n] = np.insert(self.keys[n], at, new_keys)
            self.starts[n] = np.insert(self.starts[n], at, starts)

    def _evict(self) -> None:
        if self.stored <= self.capacity:
            return
        while self.stored > self.capacity:
            self.stored -= self.documents.popleft()[1].shape[0]
        cut = self.documents[0][0] if self.documents else self.next_start
        self.store = self.store[cut - self.base :]
        self.base = cut
        for n in self.sizes:
            keep = self.starts[n] >= cut
            self.keys[n], self.starts[n] = self.keys[n][keep], self.starts[n][keep]

    def find(self, n: int, key: int) -> tuple[int, int]:
        """The range ``lo:hi`` of the size-``n`` table holding ``key`` (empty: ``lo == hi``)."""
        keys = self.keys[n]
        if not keys.shape[0]:
            return 0, 0
        probe = np.uint64(key)
        lo = hi = int(keys.searchsorted(probe, side="left"))
        if lo < keys.shape[0] and keys[lo] == probe:  # most probes miss: the second search only on a hit
            hi = int(keys.searchsorted(probe, side="right"))
        return lo, hi

    def read(self, n: int, lo: int, hi: int, offsets: np.ndarray) -> np.ndarray:
        """The tokens at ``offsets`` after the continuation starts ``lo:hi`` of the size-``n`` table: [hi - lo, L]."""
        at = self.starts[n][lo:hi, None] - self.base + offsets
        return self.store[np.minimum(at, self.store.shape[0] - 1)]  # the store ends with a separator


class NgramMemory:
    """Earlier requests (a :class:`RequestArchive`) and the current one, indexed by suffixes of ``sizes`` tokens.

    ``archive``: earlier requests shared with other memories (same ``sizes``; its capacity
    applies); None: an archive of this memory's own, of ``capacity`` tokens.
    """

    def __init__(self, sizes: Sequence[int], capacity: int, search_current: bool = True,
                 archive: RequestArchive | None = None) -> None:
        self.archive = archive if archive is not None else RequestArchive(sizes, capacity)
        self.sizes = self.archive.sizes
        if (self.sizes, self.capacity) != (tuple(sorted(set(sizes), reverse=True)), capacity):
            raise ValueError(f"a shared archive has suffix sizes {list(self.sizes)} and capacity {self.capacity}; a "
                             f"memory sharing it must have the same, not {list(sizes)} and {capacity}")
        self.search_current = search_current  # False: the current request is kept (to remember) but not searched
        self._powers = {n: pow(HASH_BASE, n, 1 << 64) for n in self.sizes}
        # the current request
        self._live = np.zeros(1024, dtype=np.int64)
        self._length = 0
        self._hashes: list[int] = [0]  # prefix hashes: _hashes[i] is the hash of _live[:i]
        self._newest: dict[int, dict[int, int]] = {n: {} for n in self.sizes}  # key -> newest start
        self._previous: dict[int, list[int]] = {n: [] for n in self.sizes}  # start -> previous start, same key
        self._indexed = 0  # continuation starts below this are indexed
        self._seen = ContextFingerprint()  # the current request's ends, to notice a context that is another one

    # --- earlier requests ---------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self.archive.capacity

    @property
    def stored(self) -> int:
        """Tokens of earlier requests kept."""
        return self.archive.stored

    def remember(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Add a finished request to the archive (the oldest documents beyond its capacity are evicted)."""
        self.archive.remember(tokens)

    def clear(self) -> None:
        """Forget every earlier request (the current one stays; a shared archive is cleared for all)."""
        self.archive.clear()

    def document_tokens(self) -> list[np.ndarray]:
        """The earlier requests kept, oldest first."""
        return self.archive.document_tokens()

    # --- the current request ------------------------------------------------------------------

    @property
    def live(self) -> np.ndarray:
        """The current request's tokens (a view; copy what you keep)."""
        return self._live[: self._length]

    def start_request(self) -> None:
        """Forget the current request's tokens (the earlier requests stay)."""
        self._length = 0
        self._hashes = [0]
        self._seen.clear()
        for n in self.sizes:
            self._newest[n].clear()
            self._previous[n].clear()
        self._indexed = 0

    def extend(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Append tokens to the current request and index the positions they complete."""
        new = [int(token) for token in tokens]
        if not new:
            return
        end = self._length + len(new)
        if end > self._live.shape[0]:
            grown = np.zeros(max(end, 2 * self._live.shape[0]), dtype=np.int64)
            grown[: self._length] = self._live[: self._length]
            self._live = grown
        self._live[self._length : end] = new
        self._length = end
        self._seen.record(self._live[:end])
        hashes, value = self._hashes, self._hashes[-1]
        for token in new:
            value = (value * HASH_BASE + token) & _MASK
            hashes.append(value)
        self._index_live()

    def follow(self, tokens: np.ndarray) -> None:
        """Make the current request ``tokens`` (the decoder's context), indexing only what is new.

        The context only grows by appending; a context that does not extend the current request
        (checked at both ends, O(1)) starts a new one.
        """
        if not self._seen.continued_by(tokens):
            self.start_request()
        if tokens.shape[0] > self._length:
            self.extend(tokens[self._length :])

    def _index_live(self) -> None:
        """Index continuation starts up to the last token: start s under the key of the n tokens before it."""
        hashes, indexed, length = self._hashes, self._indexed, self._length
        self._indexed = length
        if not self.search_current:
            return
        for n in self.sizes:
            newest, previous, power = self._newest[n], self._previous[n], self._powers[n]
            previous.extend([-1] * (min(n, length) - indexed))  # starts before n have no n tokens before them
            for start in range(max(indexed, n), length):
                key = (hashes[start] - hashes[start - n] * power) & _MASK
                previous.append(newest.get(key, -1))
                newest[key] = start

    # --- search -------------------------------------------------------------------------------

    def longest_match(self, limit: int = 1 << 30) -> Match | None:
        """The longest of ``sizes`` whose last tokens of the current request occurred before, here or earlier.

        Of the current request's occurrences the newest ``limit`` are collected (the chain is
        walked from the newest back).
        """
        length, hashes = self._length, self._hashes
        for n in self.sizes:
            if n > length:
                continue
            key = (hashes[length] - hashes[length - n] * self._powers[n]) & _MASK
            live, start, previous = [], self._newest[n].get(key, -1), self._previous[n]
            while start >= 0 and len(live) < limit:
                live.append(start)
                start = previous[start]
            lo, hi = self.archive.find(n, key)
            if live or hi > lo:
                return Match(n, np.asarray(live[::-1], dtype=np.int64), lo, hi)
        return None

    def continuations(self, match: Match, limit: int, length: int) -> np.ndarray:
        """The ``length`` tokens after the ``limit`` newest occurrences of ``match``: int64 [k, length].

        The current request's occurrences are the newest, then the memory's from the newest back.
        A row is -1 from the end of its document (or of the current request) on.
        """
        offsets = np.arange(length)
        live = match.live[max(0, match.live.shape[0] - limit) :]
        rows = []
        room = limit - live.shape[0]
        if room > 0 and match.hi > match.lo:
            rows.append(self.archive.read(match.size, max(match.lo, match.hi - room), match.hi, offsets))
        if live.shape[0]:
            at = live[:, None] + offsets
            read = self._live[np.minimum(at, self._length - 1)]
            read[at >= self._length] = SEPARATOR
            rows.append(read)
        if not rows:
            return np.zeros((0, length), dtype=np.int64)
        read = np.concatenate(rows)
        return np.where(np.cumsum(read < 0, axis=1) > 0, SEPARATOR, read)  # nothing after a document's end

    # --- persistence --------------------------------------------------------------------------

    def save(self, path: str | Path, metadata: dict[str, Any] | None = None) -> None:
        """Write the documents and ``metadata`` to ``path`` (.npz), atomically (written aside, then renamed)."""
        final = Path(path).expanduser()
        final.parent.mkdir(parents=True, exist_ok=True)
        documents = self.document_tokens()
        tokens = np.concatenate(documents) if documents else np.zeros(0, dtype=np.int64)
        header = json.dumps({**(metadata or {}), "format": FORMAT, "sizes": list(self.sizes)})
        staging = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        try:
            with staging.open("wb") as file:
                np.savez(file, header=np.array(header), tokens=tokens.astype(np.int32),
                         lengths=np.array([d.shape[0] for d in documents], dtype=np.int64))
            os.replace(staging, final)
        finally:
            staging.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: str | Path, sizes: Sequence[int], capacity: int, search_current: bool = True,
             archive: RequestArchive | None = None) -> tuple[NgramMemory, dict[str, Any]]:
        """A memory holding the documents saved at ``path`` (the newest that fit ``capacity``), and the metadata.

        ``archive``: a (shared) archive the documents are added to, as in the constructor.
        """
        source = Path(path).expanduser()
        try:
            with np.load(source, allow_pickle=False) as data:
                header = json.loads(str(data["header"]))
                tokens, lengths = np.asarray(data["tokens"], dtype=np.int64), np.asarray(data["lengths"])
        except FileNotFoundError:
            raise MemoryFileError(f"no memory file at {source}") from None
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
            raise MemoryFileError(f"{source} is not a readable Goose memory file ({error})") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            found = header.get("format") if isinstance(header, dict) else None
            raise MemoryFileError(f"{source} is not a {FORMAT} file (format {found!r})")
        if lengths.ndim != 1 or int(lengths.sum()) != tokens.shape[0] or (lengths < 0).any() or (tokens < 0).any():
            raise MemoryFileError(f"{source} is corrupt: its document lengths do not add up to its tokens")
        memory = cls(sizes, capacity, search_current, archive)
        memory.archive.add_documents(np.split(tokens, np.cumsum(lengths)[:-1]) if lengths.shape[0] else [])
        return memory, header
