"""Incremental detokenization: the text a stream of token ids adds, without decoding the whole output each time.

Decoding token by token does not work for byte-level and SentencePiece vocabularies: a character
can span tokens (the first half decodes to U+FFFD) and a token's leading space depends on what
precedes it. So each step decodes a short window that starts a few tokens back (the *prefix*)
and emits what the window adds beyond the prefix's own text, holding back while the window ends
in an incomplete character. The cost per step is the window, not the output.

Ids may come faster than their text is wanted (a session appends every cycle; only a stream's
consumer reads the pieces): :meth:`IncrementalText.extend` only records them, and a piece is
decoded when read, after every earlier one, so the pieces are the same whenever they are read.
"""

from __future__ import annotations

import threading
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
        self._ends: list[int] = []  # per extension: how many ids the text held after it
        self._last: int | None = None  # the extension after which nothing comes (its piece takes the rest)
        self._pieces: list[str] = []  # the pieces of the extensions decoded so far, in order
        self._lock = threading.Lock()  # a chunk may be read on another thread than the one extending

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, ids: Sequence[int]) -> str:
        """The text that ``ids`` complete (may be "" while a character is still incomplete)."""
        return self.piece(self.extend(ids))

    def extend(self, ids: Sequence[int], last: bool = False) -> int:
        """Record ``ids`` without decoding them; returns the mark of their piece (:meth:`piece`). ``last``: no ids
        follow, so their piece ends with whatever text is still held back."""
        self.ids.extend(int(i) for i in ids)
        self._ends.append(len(self.ids))
        mark = len(self._ends) - 1
        if last:
            self._last = mark
        return mark

    def piece(self, mark: int) -> str:
        """The text of the extension ``mark``, decoding it and every earlier one not yet decoded."""
        with self._lock:
            while len(self._pieces) <= mark:
                index = len(self._pieces)
                piece = self._advance(self._ends[index])
                self._pieces.append(piece + self._rest() if index == self._last else piece)
            return self._pieces[mark]

    def finish(self) -> str:
        """Whatever text is still held back, so that all pieces together are the whole decoded output."""
        with self._lock:
            return self._rest()

    def _advance(self, end: int) -> str:
        """The text the ids up to ``end`` complete beyond what is emitted."""
        if self.tokenizer is None:
            return ""
        prefix_text = self._decode(self.ids[self._prefix : self._read])
        window_text = self._decode(self.ids[self._prefix : end])
        if len(window_text) <= len(prefix_text) or window_text.endswith(REPLACEMENT):
            return ""
        piece = window_text[len(prefix_text) :]
        self._prefix, self._read = self._read, end
        self.emitted += piece
        return piece

    def _rest(self) -> str:
        if self.tokenizer is None:
            return ""
        full = self._decode(self.ids)
        rest = full[len(self.emitted) :] if full.startswith(self.emitted) else ""
        self.emitted += rest
        return rest
