"""Which tokenizer made a token file: a fingerprint of the vocabulary, for stores of token ids kept on disk.

Token ids only mean something in the tokenizer that made them. A datastore or a persisted memory
records :func:`tokenizer_identity` when it is written and compares fingerprints when it is read.
"""

from __future__ import annotations

import contextlib
import hashlib
import weakref
from typing import Any

_FINGERPRINTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 of the tokenizer's vocabulary (every token string, in id order).

    Two tokenizers that map some token id to different strings give different fingerprints,
    whatever their names or paths. Hashing a large vocabulary takes a while, so it is memoised per
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
