"""Building REST datastores: text, code and JSONL files tokenized in the target's tokenizer, and the default one.

* **Sources.** Each text file is one document; each JSONL record is one document made of its
  string fields (:data:`DEFAULT_JSONL_FIELDS`). Tokenized without special tokens, in batches.
* **Benchmarks never go in.** Drafting the reference answer would inflate acceptance, so
  :func:`build` refuses JSONL records that look like benchmark items.
* **The default datastore** is the running Python's standard library (``*.py`` outside tests,
  site-packages and data-table packages), capped at :data:`DEFAULT_MAX_TOKENS` tokens, built on
  first use per tokenizer and cached under ``<goose cache>/datastores/<tokenizer fingerprint>/``.
  No benchmark's reference answers are in the standard library.
"""

from __future__ import annotations

import datetime
import json
import logging
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from goose.sources.rest.datastore import FORMAT, MANIFEST, SUFFIXES_FILE, TOKENS_FILE, Datastore
from goose.sources.rest.suffix_index import SEPARATOR, DatastoreError, non_separator_suffixes
from goose.store.cache_dir import default_cache_dir
from goose.store.folders import publish
from goose.store.tokenizer_identity import tokenizer_fingerprint, tokenizer_identity

logger = logging.getLogger("goose.datastore")

# The default datastore's cap: the standard library fits under it with room to spare, and the cap
# keeps a bigger one (or a tokenizer that splits code finer) from making the first use of `rest` slow.
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
    sorted_suffixes = non_separator_suffixes(tokens)
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
        "suffix_array": "divsufsort",
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
        publish(staging, final, MANIFEST, replace=overwrite)
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
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return root / "datastores" / tokenizer_fingerprint(tokenizer)[:16] / f"stdlib-py{version}-{DEFAULT_MAX_TOKENS}"


def default_datastore(tokenizer: Any, cache_dir: str | Path | None = None, *,
                      progress: bool | None = None) -> Datastore:
    """The standard-library datastore for ``tokenizer``: opened from the cache, or built once."""
    path = default_datastore_path(tokenizer, cache_dir)
    if (path / MANIFEST).is_file():
        return Datastore.open(path, tokenizer)
    files = stdlib_files()
    logger.warning("rest: building the default datastore from %d Python standard-library files (once); "
                   "cached at %s", len(files), path)
    started = time.perf_counter()
    store = build(tokenizer, files, path, max_tokens=DEFAULT_MAX_TOKENS, suffixes=(".py",), progress=progress,
                  description=f"Python {sys.version.split()[0]} standard library (default REST datastore)")
    logger.info("rest: default datastore of %d tokens built in %.1f s", store.manifest["tokens"],
                time.perf_counter() - started)
    return store
