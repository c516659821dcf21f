"""Incremental detokenization: the text a stream of token ids adds, without decoding the whole output each time.

Decoding token by token does not work for byte-level and SentencePiece vocabularies: a character
can span tokens (the first half decodes to U+FFFD) and a token's leading space depends on what
precedes it. So each step decodes a short window that starts a few tokens back (the *prefix*)
and emits what the window adds beyond the prefix's own text, holding back while the window ends
in an incomplete character. The cost per step is the window, not the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REPLACEMENT = "\ufffd"


class IncrementalText:
    """Turns token ids, as they come, into text pieces whose concatenation is the decoded output."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.emitted = ""
        self._prefix = 0  # window start: the tokens before `_read` whose text is already emitted
        self._read = 0  # tokens whose text is emitted

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, ids: Sequence[int]) -> str:
        """The text that ``ids`` complete (may be "" while a character is still incomplete)."""
        self.ids.extend(int(i) for i in ids)
        if self.tokenizer is None:
            return ""
        prefix_text = self._decode(self.ids[self._prefix : self._read])
        window_text = self._decode(self.ids[self._prefix :])
        if len(window_text) <= len(prefix_text) or window_text.endswith(REPLACEMENT):
            return ""
        piece = window_text[len(prefix_text) :]
        self._prefix, self._read = self._read, len(self.ids)
        self.emitted += piece
        return piece

    def finish(self) -> str:
        """Whatever text is still held back, so that all pieces together are the whole decoded output."""
        if self.tokenizer is None:
            return ""
        full = self._decode(self.ids)
        rest = full[len(self.emitted) :] if full.startswith(self.emitted) else ""
        self.emitted += rest
        return rest
