"""A source in a few lines: the rest of the latest earlier line that began like this one (run: python this file)."""
import functools

import numpy as np

import goose
from goose import models
from goose.sources.toolkit import before_eos


@functools.cache
def line_tokens(tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """The ids holding a line break, and those holding only whitespace: one vocabulary pass per tokenizer."""
    pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return np.flatnonzero(["\n" in piece for piece in pieces]), np.flatnonzero([not piece.strip() for piece in pieces])


class LineSource:
    """Drafts the rest of the latest earlier line that starts with the current one (indent and first token)."""

    def __init__(self, config: goose.GooseConfig) -> None:
        self.breaks = self.blank = np.zeros(0, dtype=np.int64)  # set by goose_prefill, which comes first

    @goose.hookimpl
    def goose_prefill(self, context: goose.DecodeContext) -> None:
        self.breaks, self.blank = line_tokens(context.tokenizer)

    @goose.hookimpl
    def goose_propose(self, context: goose.DecodeContext) -> goose.Draft | None:
        tail = context.tokens[-2048:]
        starts = np.flatnonzero(np.isin(tail, self.breaks))  # a line starts at its break, which holds its indent
        current = tail[starts[-1]:] if starts.size > 1 else tail[:0]
        if np.isin(current, self.blank).all():  # no first token on this line yet
            return None
        begins, ends = starts[:-1], starts[1:]  # earlier line i: tail[begins[i] .. ends[i]], its break included
        window = np.minimum(begins[:, None] + np.arange(current.size), tail.size - 1)
        found = np.flatnonzero((ends - begins + 1 > current.size) & (tail[window] == current).all(axis=1))
        line = found[-1] if found.size else None  # the latest
        rest = [] if line is None else before_eos(tail[begins[line] + current.size:ends[line] + 1].tolist(),
                                                  context.eos_token_ids)
        return goose.Draft.chain(rest) if rest else None  # no scores: Goose keeps its acceptance


if __name__ == "__main__":
    goose.register(goose.plugins.SourcePlugin("line", LineSource, initial_acceptance=0.5))
    model, tokenizer = models.load("smollm2-135m")
    prompt, limit = "Write a Python class Point with x, y, z properties.", 64
    result = goose.generate(model, tokenizer, prompt, limit, sources=["line", "context_match", "bigram_transition"])
    same = result.new_token_ids == goose.autoregressive(model, tokenizer, prompt, limit).new_token_ids
    print(f"{result.text}\ntau {result.stats.tau:.2f}, acceptance {result.stats.source_acceptance}, lossless: {same}")
