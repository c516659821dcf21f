"""Log probabilities on the wire: each token's text, and which tokens go out with which piece of text.

A response carries the log probabilities of the tokens whose text it carries. Stop strings hold text
back (it may be the start of a stop string) and cut the output, so each token is placed in the output
text (where its text starts and ends, decoded incrementally as the output is) and goes out once all of
its text has been sent; at a stop string, the tokens whose text starts before the cut are the output's
and the rest are dropped with the text they produced. A token that holds only the first bytes of a
character goes out with the text that completes it; whatever is left when the output ends on its own
(the EOS token, which has no text in the answer) goes out with its last piece.

Everything here runs in the worker thread: it decodes with the worker's tokenizer, which must not be
used from two threads at once.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from transformers.convert_slow_tokenizer import bytes_to_unicode

from goose.cycle.detokenize import REPLACEMENT, IncrementalText
from goose.cycle.logprobs import TokenLogprob

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


@dataclass(frozen=True)
class TokenText:
    """A token as OpenAI shows it: its text (``bytes:\\xe2\\x80`` for part of a character) and its UTF-8 bytes."""

    token: str
    bytes: list[int]


@dataclass(frozen=True)
class Alternative:
    text: TokenText
    logprob: float


@dataclass(frozen=True)
class WireLogprob:
    """One output token's entry: its text, log probability, offset in the output text and top alternatives."""

    text: TokenText
    logprob: float
    offset: int
    top: tuple[Alternative, ...]


class TokenTexts:
    """Token id -> :class:`TokenText`, remembered (a request asks for the same few hundred tokens again and again)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._byte_decoder = _byte_level_decoder()
        self._known: dict[int, TokenText] = {}

    def __call__(self, token_id: int) -> TokenText:
        known = self._known.get(token_id)
        if known is None:
            known = self._known[token_id] = self._text(token_id)
        return known

    def _text(self, token_id: int) -> TokenText:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        if REPLACEMENT not in text:
            return TokenText(text, list(text.encode("utf-8")))
        raw = self._raw_bytes(token_id)  # part of a character: the token's own bytes, as OpenAI shows them
        if raw is None:
            return TokenText(text, list(text.encode("utf-8")))
        return TokenText("bytes:" + "".join(f"\\x{byte:02x}" for byte in raw), list(raw))

    def _raw_bytes(self, token_id: int) -> bytes | None:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(piece, str):
            return None
        byte = _BYTE_TOKEN.fullmatch(piece)
        if byte is not None:
            return bytes([int(byte.group(1), 16)])
        if all(char in self._byte_decoder for char in piece):  # a byte-level BPE token (GPT-2's alphabet)
            return bytes(self._byte_decoder[char] for char in piece)
        return None


class LogprobPlacer:
    """Places each output token in the output text and hands its entry out once its text has been sent."""

    def __init__(self, texts: TokenTexts) -> None:
        self.texts = texts
        self._decoded = IncrementalText(texts.tokenizer)
        self._length = 0  # characters of output text placed so far
        self._waiting: deque[list[Any]] = deque()  # [entry, where its text ends], in output order
        self._incomplete: list[list[Any]] = []  # waiting entries whose text is not decoded yet
        self.sent: list[WireLogprob] = []  # every entry handed out, in order

    def add(self, entries: Sequence[TokenLogprob]) -> None:
        """Place a cycle's new tokens, one by one, after the text placed so far."""
        for entry in entries:
            start = self._length
            piece = self._decoded.add([entry.token_id])
            self._length += len(piece)
            top = tuple(Alternative(self.texts(token), logprob) for token, logprob in entry.top)
            waiting = [WireLogprob(self.texts(entry.token_id), entry.logprob, start, top), math.inf]
            self._waiting.append(waiting)
            self._incomplete.append(waiting)
            if piece:  # this token's text, and that of the tokens before it that held part of it, is complete
                for done in self._incomplete:
                    done[1] = self._length
                self._incomplete.clear()

    def place(self, entries: Sequence[TokenLogprob], sent_length: int, *, cut: bool = False,
              ended: bool = False) -> list[WireLogprob]:
        """:meth:`add` the entries, then :meth:`release` what goes out with the text sent so far."""
        self.add(entries)
        return self.release(sent_length, cut=cut, ended=ended)

    def release(self, sent_length: int, *, cut: bool = False, ended: bool = False) -> list[WireLogprob]:
        """The entries to send with the output's first ``sent_length`` characters: those whose text has all been
        sent; with ``cut`` (a stop string ended the output there) those whose text starts before it, the
        rest dropped; with ``ended`` (the output ended on its own) all that are left."""
        released = []
        while self._waiting:
            entry, end = self._waiting[0]
            if not (ended or end <= sent_length or (cut and entry.offset < sent_length)):
                break
            released.append(self._waiting.popleft()[0])
        if cut or ended:
            self._waiting.clear()
            self._incomplete.clear()
        self.sent += released
        return released


@cache
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character that stands for each byte -> the byte."""
    return {character: byte for byte, character in bytes_to_unicode().items()}
