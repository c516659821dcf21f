"""A custom source, registered at run time: lines of lists, tables and code repeat their shape, so draft on."""
import sys

import numpy as np

import goose
from goose import models, plugins
from goose.cycle.decoder import AutoregressiveDecoder, GooseDecoder


class RepeatLastLine:
    """Drafts what followed, in the previous line, the token the current line ends with (nearest column)."""
    def __init__(self, config: goose.GooseConfig) -> None:
        self.breaks: np.ndarray | None = None  # ids of the tokens that hold a line break, found once

    @goose.hookimpl
    def goose_propose(self, context: goose.DecodeContext) -> goose.Draft | None:
        if self.breaks is None:
            pieces = context.tokenizer.batch_decode([[i] for i in range(len(context.tokenizer))])
            self.breaks = np.array([i for i, piece in enumerate(pieces) if "\n" in piece])
        tail = context.tokens[-512:]
        ends = np.flatnonzero(np.isin(tail, self.breaks))
        if ends.shape[0] < 2 or ends[-1] == tail.shape[0] - 1:
            return None
        previous, current = tail[ends[-2] + 1 : ends[-1] + 1], tail[ends[-1] + 1 :]
        columns = np.flatnonzero(previous[:-1] == current[-1]) + 1
        if columns.shape[0] == 0:
            return None
        start = columns[np.abs(columns - current.shape[0]).argmin()]
        return goose.Draft.chain(previous[start:])  # no scores: Goose fills in this source's acceptance estimate


if __name__ == "__main__":  # python examples/custom_source.py [max_new_tokens]
    plugins.register(plugins.SourcePlugin("repeat_line", RepeatLastLine, initial_acceptance=0.6))
    model, tokenizer = models.load("smollm2-135m")
    config = goose.GooseConfig(sources=["repeat_line", "context_match", "bigram_transition"], budget=16)
    prompt, limit = "Write a Python dict mapping each month to its number of days.", int((sys.argv[1:] or [64])[0])
    result = GooseDecoder(model, tokenizer, config).generate(prompt, limit)
    same = result.new_token_ids == AutoregressiveDecoder(model, tokenizer).generate(prompt, limit).new_token_ids
    print(f"{result.text}\ntau {result.stats.tau:.2f}, acceptance {result.stats.source_acceptance}, lossless: {same}")
