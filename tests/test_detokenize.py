"""Incremental text: pieces decoded as ids come, or later when read, are the same text, and all of it."""

from __future__ import annotations

import random

from goose.cycle.decoder import GooseDecoder
from goose.cycle.detokenize import IncrementalText

TEXT = "Café déjà vu 🦆🪿 naïve — 東京 ✓ x = [1, 2]\n    return f'{x!r}' 😀"


def _steps(ids: list[int], seed: int) -> list[list[int]]:
    """``ids`` cut into runs of 0 to 4 tokens, as cycles append them."""
    draw, steps, at = random.Random(seed), [], 0
    while at < len(ids):
        size = draw.randint(0, 4)
        steps.append(ids[at : at + size])
        at += size
    return steps


def test_pieces_read_late_or_out_of_order_are_the_pieces_decoded_as_ids_come(smollm2) -> None:
    _, tokenizer = smollm2
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    for seed in range(5):
        steps = _steps(ids, seed)
        eager = IncrementalText(tokenizer)
        pieces = [eager.add(step) for step in steps]
        pieces[-1] += eager.finish()
        assert "".join(pieces) == whole
        assert "" in pieces and any("\ufffd" not in piece and len(piece) > 1 for piece in pieces)
        lazy = IncrementalText(tokenizer)
        marks = [lazy.extend(step, last=i == len(steps) - 1) for i, step in enumerate(steps)]
        assert lazy._pieces == []  # nothing decoded until a piece is read
        order = list(marks)
        random.Random(seed).shuffle(order)
        assert {mark: lazy.piece(mark) for mark in order} == dict(enumerate(pieces))


def test_a_streams_chunks_read_after_the_run_hold_the_text_decoded_as_they_came(smollm2) -> None:
    model, tokenizer = smollm2
    decoder = GooseDecoder(model, tokenizer)
    chunks = list(decoder.stream("Write a haiku about a goose, with an emoji.", 48))  # nothing read while it ran
    result = decoder.last_result
    assert result is not None and len(chunks) > 2
    eager = IncrementalText(tokenizer)
    expected = [eager.add(chunk.token_ids) for chunk in chunks]
    expected[-1] += eager.finish()
    assert [chunk.text for chunk in reversed(chunks)] == expected[::-1]
    assert "".join(chunk.text for chunk in chunks) == result.text
