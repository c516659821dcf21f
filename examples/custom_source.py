"""A custom source: lists, tables and code repeat their line shape, so draft the rest of the previous line from
the column the current line has reached. Registered at run time (a packaged plugin uses entry points instead)."""

import sys

import numpy as np

import goose
from goose import Draft, GooseConfig, models
from goose.decoder import AutoregressiveDecoder, GooseDecoder
from goose.hookspecs import Register


class RepeatLastLine:
    """Drafts what followed, in the previous line, the token the current line ends with (nearest column)."""

    def __init__(self, config: GooseConfig) -> None:
        self.ema, self.acceptance = config.ema, 0.6
        self.breaks: np.ndarray | None = None  # ids of tokens holding a line break, found once

    @goose.hookimpl
    def goose_propose(self, context: goose.DecodeContext) -> Draft | None:
        if self.breaks is None:  # sources see token ids; the tokenizer comes with the context
            pieces = enumerate(context.tokenizer.batch_decode([[i] for i in range(len(context.tokenizer))]))
            self.breaks = np.array([i for i, piece in pieces if "\n" in piece])
        tail = context.tokens[-512:]
        ends = np.flatnonzero(np.isin(tail, self.breaks))
        if ends.shape[0] < 2:
            return None
        previous, current = tail[ends[-2] + 1 : ends[-1] + 1], tail[ends[-1] + 1 :]
        columns = np.flatnonzero(previous[:-1] == current[-1]) + 1 if current.shape[0] else np.zeros(1, dtype=int)
        if columns.shape[0] == 0:
            return None
        start = columns[np.abs(columns - current.shape[0]).argmin()]
        return Draft.chain(previous[start:].tolist(), self.acceptance)

    @goose.hookimpl
    def goose_acceptance(self) -> float:
        return self.acceptance

    @goose.hookimpl
    def goose_observe(self, outcome: goose.VerifyOutcome) -> None:
        self.acceptance = outcome.updated_acceptance("repeat_line", self.acceptance, self.ema)


@goose.hookimpl
def goose_register_sources(register: Register) -> None:
    register("repeat_line", RepeatLastLine, description="drafts the rest of the previous line")


if __name__ == "__main__":  # python examples/custom_source.py [max_new_tokens]
    goose.plugins.register(sys.modules[__name__])
    model, tokenizer = models.load("smollm2-135m")
    config = GooseConfig(sources=["repeat_line", "context_match", "bigram_transition"], budget=16)
    prompt, limit = "Write a Python dict mapping each month to its number of days.", int((sys.argv[1:] or [64])[0])
    result = GooseDecoder(model, tokenizer, config).generate(prompt, limit)
    same = result.new_token_ids == AutoregressiveDecoder(model, tokenizer).generate(prompt, limit).new_token_ids
    print(f"{result.text}\ntau {result.stats.tau:.2f}, acceptance {result.stats.source_acceptance}, lossless: {same}")
