"""A retrieval datastore: token ids of a corpus in the target's tokenizer, with a suffix array.

REST (retrieval-based speculative decoding) drafts what followed the context's last few tokens
*in a corpus*: find every occurrence of the longest suffix of the context in the datastore and
turn their continuations into a trie of likely next tokens. This module owns the corpus side:

* **Layout.** A datastore is a folder: ``tokens.npy`` (int32 token ids, documents separated by
  :data:`SEPARATOR` = -1, which no query contains, so a match never spans two documents, and
  ending with one so every read past a document stops there), ``suffixes.npy`` (the suffix
  array: start positions of every non-separator suffix in lexicographic order, int32 below 2**31
  tokens) and ``manifest.json`` (the tokenizer it was built for, counts, sources). Token ids are
  int32, never 16-bit: Gemma 3 has 262,144 tokens.
* **Opening** is ``np.load(mmap_mode="r")``: nothing is read or rebuilt per request; the OS
  pages in the few suffix-array entries a binary search touches.
* **Tokenizer guard.** Token ids only mean something in the tokenizer that made them. The
  manifest records the tokenizer's name, size and a fingerprint of its vocabulary, and
  :meth:`Datastore.check_tokenizer` refuses a datastore built for another tokenizer with a
  message that says how to rebuild it.
* **Suffix array.** libdivsufsort through ``pydivsufsort`` (MIT, manylinux wheels) when it is
  installed: about 2 s for 3M tokens. Otherwise a NumPy prefix-doubling sort (same result,
  slower: O(n log n) per doubling round). Both give the exact suffix order with -1 sorting first.
* **Search** (:meth:`SuffixIndex.longest_match`): the context's last ``min_span..max_span``
  tokens are searched *together*, one vectorised binary search over the suffix array in which
  every probe compares at most ``max_span`` tokens; no suffix is ever materialised.
* **Default datastore**: the running Python's standard library (``*.py`` outside tests,
  site-packages and data-table packages), capped at :data:`DEFAULT_MAX_TOKENS` tokens, built on
  first use per tokenizer and cached under ``<goose cache>/datastores/<tokenizer fingerprint>/``.
  It is safe for benchmarks: no benchmark's reference answers are in the standard library.
  Benchmark files must never be put into a datastore (drafting the reference answer would
  inflate acceptance); :func:`build` refuses JSONL records that look like benchmark items.

The CLI, ``goose datastore build|info``, is registered from here with
:func:`goose.cli.register_command`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("goose.datastore")

FORMAT = "goose-datastore/1"
SEPARATOR = -1  # between documents; never part of a query, so matches stay inside one document
MANIFEST = "manifest.json"
TOKENS_FILE = "tokens.npy"
SUFFIXES_FILE = "suffixes.npy"

# Python 3.11's standard library (456 files) is 2.28M SmolLM2 / 2.38M Gemma 3 tokens: tokenizing
# takes 5-6 s on two idle cores (15 s when they are busy), the suffix array under 1 s (17-18 MiB
# on disk). The cap keeps a bigger stdlib
# (or a tokenizer that splits code finer) from making the first use of `rest` take minutes.
DEFAULT_MAX_TOKENS = 4_000_000

# JSONL: the string fields a record contributes, in this order, joined by a newline into one
# document (a prompt and its completion belong together). A field holding a list of chat
# messages ({"role", "content"} objects) contributes their contents.
DEFAULT_JSONL_FIELDS: tuple[str, ...] = ("text", "content", "code", "prompt", "completion", "response", "messages")

# Files a directory contributes when walked (a file named explicitly is always read).
DEFAULT_SUFFIXES: tuple[str, ...] = (
    ".py", ".pyi", ".txt", ".md", ".rst", ".jsonl", ".c", ".h", ".cc", ".cpp", ".hpp", ".java", ".js", ".ts",
    ".go", ".rs", ".rb", ".sh", ".sql", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".html", ".css", ".tex",
)

# Keys of benchmark items (HumanEval, MBPP, ClassEval, MT-Bench, GSM8K): a record holding one of
# these is a benchmark question or its reference answer, which must never become retrievable.
_BENCHMARK_KEYS = frozenset({"task_id", "question_id", "canonical_solution", "test_list", "solution_code",
                             "entry_point"})

# Parts of the stdlib tree the default datastore skips: tests (huge, and mostly assertions),
# third-party packages installed into the interpreter, and packages that are data tables
# (codec maps, pydoc's topic text) whose repetitive lines would swamp the frequency counts.
_STDLIB_SKIP = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo",
                          "encodings", "pydoc_data", "__pycache__"})

_MANIFEST_SOURCES = 20  # paths listed in a manifest (the count of all is recorded too)
_BATCH_CHARS = 1 << 20  # texts handed to the tokenizer per call: big enough to amortise, small in memory


class DatastoreError(ValueError):
    """A datastore that is missing, malformed, or built for another tokenizer; the message says what to do."""


# --------------------------------------------------------------------------- suffix arrays


def suffix_array(tokens: np.ndarray, backend: str = "auto") -> np.ndarray:
    """Start positions of all suffixes of ``tokens`` in lexicographic order (int32, or int64 past 2**31).

    Values compare as signed integers (so :data:`SEPARATOR` sorts first) and a suffix sorts
    before its own extensions. ``backend``: "divsufsort" (needs pydivsufsort), "numpy", or
    "auto" (divsufsort when installed).
    """
    tokens = np.ascontiguousarray(tokens)
    n = tokens.shape[0]
    index_dtype = np.int32 if n < 2**31 - 1 else np.int64
    if n == 0:
        return np.zeros(0, dtype=index_dtype)
    if n == 1:
        return np.zeros(1, dtype=index_dtype)
    if backend not in ("auto", "divsufsort", "numpy"):
        raise ValueError(f"unknown suffix-array backend {backend!r}; use auto, divsufsort or numpy")
    if backend in ("auto", "divsufsort"):
        try:
            from pydivsufsort import divsufsort
        except ImportError:
            if backend == "divsufsort":
                raise
        else:
            # pydivsufsort sorts an int array as big-endian bytes of (value - min) after flipping the
            # sign bit: lexicographic byte order is numeric order, and it keeps only the suffixes
            # that start on a token boundary
            values = tokens if tokens.dtype in (np.int32, np.int64) else tokens.astype(np.int64)
            return np.asarray(divsufsort(values), dtype=index_dtype)
    return _suffix_array_doubling(tokens).astype(index_dtype)


def suffix_array_backend() -> str:
    """The backend ``suffix_array(backend="auto")`` uses here."""
    try:
        import pydivsufsort  # noqa: F401
    except ImportError:
        return "numpy"
    return "divsufsort"


def _suffix_array_doubling(tokens: np.ndarray) -> np.ndarray:
    """Prefix doubling (Manber-Myers) with NumPy sorts: rank by the first 2k tokens from ranks of k.

    Each round is one argsort of n int64 keys; the number of rounds is log2 of the longest
    repeat, so this is fine for a few million tokens and the reference the fast backend is
    tested against.
    """
    n = tokens.shape[0]
    rank = np.unique(tokens, return_inverse=True)[1].astype(np.int64).reshape(-1)  # dense ranks 0..
    width = 1
    while True:
        # key = (rank of the first `width` tokens, rank of the next `width`); past the end: -1 sorts first
        second = np.full(n, -1, dtype=np.int64)
        second[: n - width] = rank[width:]
        key = rank * (n + 1) + (second + 1)
        order = np.argsort(key, kind="stable")
        ordered = key[order]
        new_rank = np.empty(n, dtype=np.int64)
        new_rank[order] = np.concatenate(([0], np.cumsum(ordered[1:] != ordered[:-1])))
        rank = new_rank
        if int(rank[order[-1]]) == n - 1 or width >= n:  # all ranks distinct: the order is final
            return order
        width *= 2


# --------------------------------------------------------------------------- search


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
    def from_documents(cls, documents: Iterable[Sequence[int] | np.ndarray], backend: str = "auto") -> SuffixIndex:
        """An in-memory index over token sequences (each becomes one document)."""
        tokens = _join_documents(documents)
        return cls(tokens, _non_separator_suffixes(tokens, backend))

    def __len__(self) -> int:
        """Number of searchable suffixes (non-separator tokens)."""
        return int(self.suffixes.shape[0])

    def ranges(self, patterns: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Suffix-array ranges [lo, hi) of several patterns at once.

        ``patterns`` int64 [S, L] (row i's first ``lengths[i]`` tokens are the pattern). Lower and
        upper bounds of all rows are found by one binary search that moves 2S cursors per step;
        each probe gathers the L tokens at the probed suffix and compares them with the pattern.
        About log2(len) steps of a few small NumPy ops (~1.5 ms for 2M tokens), whatever the corpus size.
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


def _join_documents(documents: Iterable[Sequence[int] | np.ndarray]) -> np.ndarray:
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


def _non_separator_suffixes(tokens: np.ndarray, backend: str = "auto") -> np.ndarray:
    order = suffix_array(tokens, backend)
    return order[tokens[order] != SEPARATOR]  # suffixes starting at a separator never match a query


# --------------------------------------------------------------------------- tokenizer identity


_FINGERPRINTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 of the tokenizer's vocabulary (every token string, in id order).

    Two tokenizers that map some token id to different strings give different fingerprints,
    whatever their names or paths. About 1 s for Gemma's 262k tokens, so it is memoised per
    tokenizer object.
    """
    with contextlib.suppress(TypeError):
        if tokenizer in _FINGERPRINTS:
            return _FINGERPRINTS[tokenizer]
    vocab: dict[str, int] = tokenizer.get_vocab()
    strings = [""] * (max(vocab.values(), default=-1) + 1)
    for token, index in vocab.items():
        strings[index] = token
    digest = hashlib.sha256("\x00".join(strings).encode("utf-8", "surrogatepass")).hexdigest()
    with contextlib.suppress(TypeError):
        _FINGERPRINTS[tokenizer] = digest
    return digest


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    """What a manifest records about the tokenizer a datastore was built with."""
    return {"name": str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
            "vocab_size": len(tokenizer), "fingerprint": tokenizer_fingerprint(tokenizer)}


# --------------------------------------------------------------------------- the on-disk datastore


class Datastore(SuffixIndex):
    """A datastore folder, memory-mapped. Open with :meth:`open`; build with :func:`build`."""

    def __init__(self, path: Path, manifest: dict[str, Any], tokens: np.ndarray, suffixes: np.ndarray) -> None:
        super().__init__(tokens, suffixes)
        self.path = path
        self.manifest = manifest

    @classmethod
    def open(cls, path: str | Path, tokenizer: Any = None) -> Datastore:
        """Memory-map the datastore at ``path``; with ``tokenizer``, refuse one built for another tokenizer."""
        folder = Path(path).expanduser()
        manifest = read_manifest(folder)
        try:
            tokens = np.load(folder / TOKENS_FILE, mmap_mode="r")
            suffixes = np.load(folder / SUFFIXES_FILE, mmap_mode="r")
        except (OSError, ValueError) as error:
            raise DatastoreError(f"datastore {folder} is damaged ({error}); rebuild it with `goose datastore build`") \
                from None
        if tokens.dtype != np.int32 or tokens.shape[0] != manifest["tokens"] or \
                suffixes.shape[0] != manifest["suffixes"]:
            raise DatastoreError(f"datastore {folder}: arrays disagree with its manifest; rebuild it")
        store = cls(folder, manifest, tokens, suffixes)
        if tokenizer is not None:
            store.check_tokenizer(tokenizer)
        return store

    @property
    def tokenizer_info(self) -> dict[str, Any]:
        return dict(self.manifest["tokenizer"])

    def check_tokenizer(self, tokenizer: Any) -> None:
        """Raise DatastoreError unless this datastore was built with ``tokenizer``'s vocabulary."""
        built = self.manifest["tokenizer"]
        if built["vocab_size"] == len(tokenizer) and built["fingerprint"] == tokenizer_fingerprint(tokenizer):
            return
        now = tokenizer_identity(tokenizer)
        raise DatastoreError(
            f"datastore {self.path} was built for tokenizer {built['name']!r} (vocabulary {built['vocab_size']}, "
            f"fingerprint {built['fingerprint'][:12]}), but the model's tokenizer is {now['name']!r} "
            f"(vocabulary {now['vocab_size']}, fingerprint {now['fingerprint'][:12]}); token ids differ between "
            "tokenizers, so rebuild it for this model: goose datastore build --model MODEL --from PATH... --out DIR"
        )

    def check_vocab(self, vocab_size: int) -> None:
        """Without a tokenizer at hand, at least refuse token ids the model cannot have."""
        if self.manifest["tokenizer"]["vocab_size"] > vocab_size:
            raise DatastoreError(f"datastore {self.path} was built for a vocabulary of "
                                 f"{self.manifest['tokenizer']['vocab_size']} tokens; the model has {vocab_size}")


def read_manifest(folder: Path) -> dict[str, Any]:
    """The manifest of the datastore in ``folder``, checked for the fields Goose relies on."""
    path = folder / MANIFEST
    if not folder.is_dir():
        raise DatastoreError(f"no datastore at {folder}: build one with `goose datastore build --model MODEL "
                             f"--from PATH... --out {folder}`")
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise DatastoreError(f"{folder} is not a Goose datastore (no {MANIFEST}); build one with "
                             "`goose datastore build`") from None
    except (OSError, ValueError) as error:
        raise DatastoreError(f"datastore manifest {path} is unreadable: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DatastoreError(f"{path} is not a {FORMAT} manifest (format {manifest.get('format')!r}); rebuild it")
    for key in ("tokens", "suffixes", "tokenizer"):
        if key not in manifest:
            raise DatastoreError(f"datastore manifest {path} lacks {key!r}; rebuild it")
    return manifest


# --------------------------------------------------------------------------- building


@dataclass
class _Corpus:
    """Token arrays as they are tokenized, with the counts the manifest records."""

    max_tokens: int | None
    parts: list[np.ndarray] = field(default_factory=list)
    tokens: int = 0  # without separators
    documents: int = 0
    truncated: bool = False

    @property
    def full(self) -> bool:
        return self.max_tokens is not None and self.tokens >= self.max_tokens

    def add(self, ids: Sequence[int]) -> None:
        if not ids or self.full:
            return
        if self.max_tokens is not None and self.tokens + len(ids) > self.max_tokens:
            ids = ids[: self.max_tokens - self.tokens]
            self.truncated = True
        self.parts += [np.asarray(ids, dtype=np.int32), np.array([SEPARATOR], dtype=np.int32)]
        self.tokens += len(ids)
        self.documents += 1


def build(
    tokenizer: Any,
    paths: Sequence[str | Path],
    out: str | Path,
    *,
    max_tokens: int | None = None,
    fields: Sequence[str] = DEFAULT_JSONL_FIELDS,
    suffixes: Sequence[str] = DEFAULT_SUFFIXES,
    allow_benchmark: bool = False,
    overwrite: bool = False,
    progress: bool | None = None,
    description: str = "",
) -> Datastore:
    """Tokenize text, code and JSONL files (or folders of them) into a datastore at ``out``.

    Each text file is one document; each JSONL record is one document made of its ``fields``
    (see :data:`DEFAULT_JSONL_FIELDS`). Tokenized without special tokens. ``max_tokens`` caps the
    corpus (files are read in sorted order). ``progress``: a tqdm bar over files (None: only on a
    terminal). The folder appears complete or not at all (built aside, then renamed).
    """
    files = collect_files(paths, suffixes)
    if not files:
        raise DatastoreError(f"no files to read under {', '.join(map(str, paths))} "
                             f"(looked for {', '.join(suffixes)})")
    documents = _file_documents(files, fields, allow_benchmark, progress)
    named = [str(Path(p).expanduser().resolve()) for p in paths]
    # the manifest names what was indexed, so a reader can tell a benchmark file from a corpus;
    # a long list of files (the stdlib) is summarised by its first entries
    extra = {"sources": named[:_MANIFEST_SOURCES], "sources_named": len(named), "files": len(files),
             "jsonl_fields": list(fields)}
    return build_from_texts(tokenizer, documents, out, max_tokens=max_tokens, overwrite=overwrite,
                            description=description, extra=extra)


def build_from_texts(
    tokenizer: Any,
    texts: Iterable[str],
    out: str | Path,
    *,
    max_tokens: int | None = None,
    overwrite: bool = False,
    description: str = "",
    extra: dict[str, Any] | None = None,
) -> Datastore:
    """Tokenize ``texts`` (one document each) and write the datastore folder ``out``."""
    final = Path(out).expanduser()
    if final.exists() and not overwrite and any(final.iterdir()):
        raise DatastoreError(f"{final} exists and is not empty; pass --force to replace it")
    started = time.perf_counter()
    corpus = _Corpus(max_tokens)
    batch: list[str] = []
    size = 0
    for text in texts:
        if corpus.full:
            break
        batch.append(text)
        size += len(text)
        if size >= _BATCH_CHARS:
            _tokenize_into(tokenizer, batch, corpus)
            batch, size = [], 0
    _tokenize_into(tokenizer, batch, corpus)
    if corpus.tokens == 0:
        raise DatastoreError("the sources hold no text to index")
    tokens = np.concatenate(corpus.parts)
    tokenized_s = time.perf_counter() - started
    backend = suffix_array_backend()
    sorted_suffixes = _non_separator_suffixes(tokens, backend)
    manifest = {
        "format": FORMAT,
        "description": description,
        "tokenizer": tokenizer_identity(tokenizer),
        "tokens": int(tokens.shape[0]),
        "suffixes": int(sorted_suffixes.shape[0]),
        "documents": corpus.documents,
        "separator": SEPARATOR,
        "max_tokens": max_tokens,
        "truncated": corpus.truncated,
        "suffix_array": backend,
        "tokenize_s": round(tokenized_s, 2),
        "build_s": round(time.perf_counter() - started, 2),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **(extra or {}),
    }
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        np.save(staging / TOKENS_FILE, tokens)
        np.save(staging / SUFFIXES_FILE, sorted_suffixes)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")  # written last: marks it complete
        _publish(staging, final, overwrite)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Datastore.open(final)


def _tokenize_into(tokenizer: Any, texts: list[str], corpus: _Corpus) -> None:
    if not texts:
        return
    # verbose=False: long documents are fine here, the model's context length does not apply
    encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    for ids in encoded:
        corpus.add(ids)


def _publish(staging: Path, final: Path, overwrite: bool) -> None:
    """Rename the finished folder into place (another process may have published it meanwhile)."""
    if final.exists():
        if (final / MANIFEST).is_file() and not overwrite:
            return  # a concurrent build of the same datastore finished first; keep theirs
        shutil.rmtree(final)
    try:
        os.rename(staging, final)
    except OSError:
        if not (final / MANIFEST).is_file():
            raise


def collect_files(paths: Sequence[str | Path], suffixes: Sequence[str] = DEFAULT_SUFFIXES) -> list[Path]:
    """Every file named in ``paths`` plus, under each folder, the files with one of ``suffixes``; sorted."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(tuple(suffixes))
                            and "__pycache__" not in p.parts)
        else:
            raise FileNotFoundError(f"no such file or folder: {path}")
    return list(dict.fromkeys(found))  # a file named twice is read once


def _file_documents(files: Sequence[Path], fields: Sequence[str], allow_benchmark: bool,
                    progress: bool | None) -> Iterator[str]:
    from tqdm.auto import tqdm

    bar = tqdm(files, desc="tokenizing", unit="file", disable=None if progress is None else not progress)
    for path in bar:
        if path.name.endswith(".jsonl"):
            yield from _jsonl_documents(path, fields, allow_benchmark)
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            logger.info("skipping %s: not UTF-8 text", path)
            continue
        if text.strip():
            yield text


def _jsonl_documents(path: Path, fields: Sequence[str], allow_benchmark: bool) -> Iterator[str]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as error:
                raise DatastoreError(f"{path}:{number}: not JSON ({error})") from None
            if not isinstance(record, dict):
                continue
            if not allow_benchmark and (_BENCHMARK_KEYS & record.keys() or {"question", "answer"} <= record.keys()):
                raise DatastoreError(
                    f"{path}:{number} looks like a benchmark item (keys {sorted(record)}); benchmark questions and "
                    "reference answers must never go into a datastore, since drafting the reference answer "
                    "inflates acceptance. Pass --allow-benchmark-records only for a training split you mean to use")
            text = "\n".join(part for name in fields if (part := _field_text(record.get(name))))
            if text.strip():
                yield text


def _field_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # chat messages
        return "\n".join(m["content"] for m in value if isinstance(m, dict) and isinstance(m.get("content"), str))
    return ""


# --------------------------------------------------------------------------- the default datastore


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The standard library's own ``*.py`` files (see :data:`_STDLIB_SKIP`), sorted by path."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    return sorted(p for p in base.rglob("*.py") if not _STDLIB_SKIP & set(p.relative_to(base).parts[:-1]))


def default_datastore_path(tokenizer: Any, cache_dir: str | Path | None = None) -> Path:
    """Where the default (standard-library) datastore for ``tokenizer`` is cached."""
    from goose.models import default_cache_dir

    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return root / "datastores" / tokenizer_fingerprint(tokenizer)[:16] / f"stdlib-py{version}-{DEFAULT_MAX_TOKENS}"


def default_datastore(tokenizer: Any, cache_dir: str | Path | None = None, *,
                      progress: bool | None = None) -> Datastore:
    """The standard-library datastore for ``tokenizer``: opened from the cache, or built once (5-20 s)."""
    path = default_datastore_path(tokenizer, cache_dir)
    if (path / MANIFEST).is_file():
        return Datastore.open(path, tokenizer)
    files = stdlib_files()
    logger.warning("rest: building the default datastore from %d Python standard-library files (once, "
                   "5-20 s); cached at %s", len(files), path)
    started = time.perf_counter()
    store = build(tokenizer, files, path, max_tokens=DEFAULT_MAX_TOKENS, suffixes=(".py",), progress=progress,
                  description=f"Python {sys.version.split()[0]} standard library (default REST datastore)")
    logger.info("rest: default datastore of %d tokens built in %.1f s", store.manifest["tokens"],
                time.perf_counter() - started)
    return store


# --------------------------------------------------------------------------- CLI: goose datastore


def _add_cli(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(title="actions", dest="action")
    make = actions.add_parser("build", help="tokenize files into a datastore for one model's tokenizer",
                              description="Tokenize text, code and JSONL files (or folders) into a datastore.")
    # only the tokenizer matters: a datastore serves every dtype and device of the model
    make.add_argument("--model", default="smollm2-135m",
                      help="whose tokenizer: smollm2-135m (default), gemma3-270m, a Hugging Face id or a local path")
    source = make.add_mutually_exclusive_group(required=True)
    source.add_argument("--from", dest="sources", nargs="+", metavar="PATH", help="files or folders to index")
    source.add_argument("--stdlib", action="store_true",
                        help="the default datastore: this Python's standard library (cached; --out optional)")
    make.add_argument("--out", type=Path, default=None, help="the datastore folder to write")
    make.add_argument("--max-tokens", type=int, default=None, help="stop after this many tokens")
    make.add_argument("--field", dest="fields", action="append", default=None, metavar="NAME",
                      help=f"JSONL string field to index (repeatable; default: {', '.join(DEFAULT_JSONL_FIELDS)})")
    make.add_argument("--ext", dest="suffixes", action="append", default=None, metavar=".EXT",
                      help="file suffix read when walking folders (repeatable; default: common text and code)")
    make.add_argument("--allow-benchmark-records", action="store_true",
                      help="index JSONL records that look like benchmark items (never do this for evaluation data)")
    make.add_argument("--force", action="store_true", help="replace an existing datastore at --out")
    make.set_defaults(run=_run_build)
    show = actions.add_parser("info", help="describe a datastore", description="Describe a datastore folder.")
    show.add_argument("path", type=Path)
    show.add_argument("--json", action="store_true")
    show.set_defaults(run=_run_info)
    parser.set_defaults(run=lambda _args: parser.print_help() or 2)


def _load_tokenizer(args: argparse.Namespace) -> Any:
    from goose import models

    logger.info("loading %s for its tokenizer", args.model)
    _model, tokenizer = models.load(args.model, dtype="float32", progress=False)
    return tokenizer


def _run_build(args: argparse.Namespace) -> int:
    if args.max_tokens is not None and args.max_tokens <= 0:
        raise ValueError(f"--max-tokens must be positive, got {args.max_tokens}")
    if args.sources and args.out is None:
        raise ValueError("--out is required with --from")
    tokenizer = _load_tokenizer(args)
    started = time.perf_counter()
    if args.stdlib:
        if args.out is None:
            store = default_datastore(tokenizer, progress=True)
        else:
            store = build(tokenizer, stdlib_files(), args.out, max_tokens=args.max_tokens or DEFAULT_MAX_TOKENS,
                          suffixes=(".py",), overwrite=args.force, progress=True,
                          description=f"Python {sys.version.split()[0]} standard library")
    else:
        store = build(tokenizer, args.sources, args.out, max_tokens=args.max_tokens,
                      fields=tuple(args.fields or DEFAULT_JSONL_FIELDS),
                      suffixes=tuple(args.suffixes or DEFAULT_SUFFIXES),
                      allow_benchmark=args.allow_benchmark_records, overwrite=args.force, progress=True)
    print(f"datastore {store.path}: {store.manifest['documents']} documents, {len(store)} tokens "
          f"({_size(store.path) / 2**20:.1f} MiB) in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


def _run_info(args: argparse.Namespace) -> int:
    store = Datastore.open(args.path)
    info = {"path": str(store.path), "size_bytes": _size(store.path), **store.manifest}
    if args.json:
        print(json.dumps(info))
        return 0
    tokenizer = info["tokenizer"]
    print(f"path:        {info['path']}  ({info['size_bytes'] / 2**20:.1f} MiB)")
    print(f"tokenizer:   {tokenizer['name']} (vocabulary {tokenizer['vocab_size']}, "
          f"fingerprint {tokenizer['fingerprint'][:16]})")
    print(f"content:     {info['documents']} documents, {info['suffixes']} tokens"
          + (f" (capped at {info['max_tokens']})" if info.get("truncated") else ""))
    if info.get("description"):
        print(f"description: {info['description']}")
    if info.get("sources"):
        more = info.get("sources_named", len(info["sources"])) - 3
        print(f"sources:     {info.get('files', '?')} files from {', '.join(info['sources'][:3])}"
              + (f" and {more} more" if more > 0 else ""))
    print(f"built:       {info.get('created', '?')} in {info.get('build_s', '?')} s "
          f"(suffix array: {info.get('suffix_array', '?')})")
    return 0


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def _register_cli() -> None:
    from goose import cli

    cli.register_command("datastore", "build or describe a retrieval datastore for the rest source", _add_cli)


_register_cli()
