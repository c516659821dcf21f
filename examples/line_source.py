"""A realistic source in a few lines: draft the rest of the latest earlier line that began like this one.

Code, lists and tables repeat how their lines open: once the current line has its indent and first
token, the latest earlier line that starts the same way is a cheap guess for how it goes on. Registered
at run time beside built-in sources (the most trusted lays the spine): ``python examples/line_source.py [N]``.
"""
import sys

import numpy as np

import goose
from goose import models
from goose.sources.toolkit import before_eos


class LineSource:
    """Drafts the rest of the latest earlier line that starts with the current one (indent and first token)."""

    def __init__(self, config: goose.GooseConfig) -> None:
        self.breaks = self.blank = np.zeros(0, dtype=np.int64)  # ids holding a line break / only whitespace

    @goose.hookimpl
    def goose_prefill(self, context: goose.DecodeContext) -> None:
        if not self.breaks.size:  # once: the tokenizer does not change
            pieces = context.tokenizer.batch_decode([[i] for i in range(len(context.tokenizer))])
            self.breaks = np.array([i for i, piece in enumerate(pieces) if "\n" in piece])
            self.blank = np.array([i for i, piece in enumerate(pieces) if not piece.strip()])

    @goose.hookimpl
    def goose_propose(self, context: goose.DecodeContext) -> goose.Draft | None:
        tail = context.tokens[-2048:]
        starts = np.flatnonzero(np.isin(tail, self.breaks))  # a line starts at its break, which holds its indent
        current = tail[starts[-1] :] if starts.size > 1 else tail[:0]
        if np.isin(current, self.blank).all():  # no first token on this line yet
            return None
        for start, end in zip(starts[-2::-1], starts[:0:-1], strict=True):  # earlier lines, latest first
            line = tail[start : end + 1]  # up to the break that ends it
            if line.size > current.size and (line[: current.size] == current).all():
                rest = before_eos(line[current.size :].tolist(), context.eos_token_ids)
                return goose.Draft.chain(rest) if rest else None  # no scores: Goose keeps its acceptance
        return None


if __name__ == "__main__":
    goose.register(goose.plugins.SourcePlugin("line", LineSource, initial_acceptance=0.5))
    model, tokenizer = models.load("smollm2-135m")
    prompt, limit = "Write a Python class Point with x, y, z properties.", int((sys.argv[1:] or [64])[0])
    result = goose.generate(model, tokenizer, prompt, limit, sources=["line", "context_match", "bigram_transition"])
    same = result.new_token_ids == goose.autoregressive(model, tokenizer, prompt, limit).new_token_ids
    print(f"{result.text}\ntau {result.stats.tau:.2f}, acceptance {result.stats.source_acceptance}, lossless: {same}")
