"""A REST datastore on disk: a corpus's token ids in the target's tokenizer and their suffix array, memory-mapped.

A datastore is a folder: ``tokens.npy`` (int32 token ids, documents separated by the separator -1
and ending with one; never 16-bit: Gemma 3 has 262,144 tokens), ``suffixes.npy`` (the suffix
array, :mod:`goose.sources.rest.suffix_index`) and ``manifest.json`` (the tokenizer it was built
for, counts, sources; written last, so a folder with a manifest is complete). Opening is
``np.load(mmap_mode="r")``: nothing is read or rebuilt per request; the OS pages in the few
suffix-array entries a binary search touches. A datastore built for another tokenizer is refused
with a message that says how to rebuild it (:mod:`goose.store.tokenizer_identity`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from goose.sources.rest.suffix_index import DatastoreError, SuffixIndex
from goose.sources.toolkit import same_tokenizer
from goose.store.tokenizer_identity import tokenizer_identity

FORMAT = "goose-datastore/1"
MANIFEST = "manifest.json"
TOKENS_FILE = "tokens.npy"
SUFFIXES_FILE = "suffixes.npy"


class Datastore(SuffixIndex):
    """A datastore folder, memory-mapped. Open with :meth:`open`; build with :func:`goose.sources.rest.corpus.build`."""

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

    def check_tokenizer(self, tokenizer: Any) -> None:
        """Raise DatastoreError unless this datastore was built with ``tokenizer``'s vocabulary."""
        built, now = self.manifest["tokenizer"], tokenizer_identity(tokenizer)
        if same_tokenizer(built, now):
            return
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


__all__ = ["Datastore", "read_manifest"]
