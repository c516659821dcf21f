"""goose-freq-next: draft, from the anchor, the token that most often followed each token so far in this request.

The walkthrough source of docs/plugins.md ("write a source, install it, study it"): one class, one
entry point. Its counts are the request's own bigrams (prompt and output), updated with the new
tokens each cycle; ``source_options["freq_next"]["depth"]`` caps the chain (default 4).
"""

from __future__ import annotations

from collections import Counter

import goose


class FreqNext:
    def __init__(self, config: goose.GooseConfig) -> None:
        self.depth = int(config.options_for("freq_next").get("depth", 4))
        self.goose_reset()

    @goose.hookimpl
    def goose_reset(self) -> None:
        self.follows: dict[int, Counter[int]] = {}
        self.counted = 0  # tokens of the context whose following pair is counted

    @goose.hookimpl
    def goose_propose(self, context: goose.DecodeContext) -> goose.Draft | None:
        tokens = context.tokens.tolist()
        start = max(self.counted - 1, 0)
        for token, after in zip(tokens[start:-1], tokens[start + 1:], strict=True):  # only the new pairs
            self.follows.setdefault(token, Counter())[after] += 1
        self.counted = len(tokens)
        chain, token = [], context.anchor
        while len(chain) < self.depth and (counts := self.follows.get(token)):
            token = counts.most_common(1)[0][0]
            chain.append(token)
        return goose.Draft.chain(chain) if chain else None


@goose.hookimpl
def goose_register_sources(register: goose.hookspecs.Register) -> None:
    register("freq_next", FreqNext, description="the most frequent next token of each token so far, chained",
             initial_acceptance=0.3)
