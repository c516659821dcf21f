"""Which tokenizer a source's stored token ids belong to (:mod:`goose.store.tokenizer_identity`).

Token ids only mean something in the tokenizer that made them, so a datastore or a memory file
records the tokenizer's identity when written and is refused when read for another one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from goose.contract.candidates import DecodeContext
from goose.store.tokenizer_identity import tokenizer_identity


def context_identity(context: DecodeContext) -> dict[str, Any]:
    """The identity of the context's tokenizer; without one, only the vocabulary size is known."""
    if context.tokenizer is None:
        return {"name": "", "vocab_size": context.vocab_size, "fingerprint": ""}
    return tokenizer_identity(context.tokenizer)


def same_tokenizer(recorded: Mapping[str, Any], identity: Mapping[str, Any]) -> bool:
    """Whether ids stored under ``recorded`` mean the same tokens under ``identity`` (vocabulary and fingerprint)."""
    return (recorded.get("vocab_size") == identity.get("vocab_size")
            and recorded.get("fingerprint") == identity.get("fingerprint"))
