"""Lookahead decoding (Fu et al., 2024): n-grams grown by Jacobi iterations that ride in the verify pass.

Jacobi decoding guesses the next W tokens at once and refines the guesses with every forward
pass; each guess is the target's own prediction after the guess before it, so even a guess that
is not (yet) right at its position often forms an n-gram the target *will* produce somewhere.
Lookahead keeps the last N-1 Jacobi iterations as a 2D window (N-1 levels x W columns), runs it in
the same forward pass as verification, and moves every column's trajectory (its N-1 past guesses
plus the newest prediction: an N-gram) into a pool keyed by the n-gram's first token. When the
anchor token is a key, the pool's n-grams starting with it are the draft.

Here the window rides as ``goose_auxiliary_rows``: the verifier appends it after the draft tree,
every window row sees the cached context and the anchor but no draft node (and no draft node sees
the window), and its key/values are dropped after the pass. So the window changes no draft row's
logits and cannot change the output; it only changes what the pool proposes next cycle.

Window layout (the paper's): level ``l`` (0 = oldest iteration), column ``j`` sits at position
``anchor + l + j + 1``. Level 0 is a causal Jacobi row (column j sees level-0 columns 0..j); a
cell at level l >= 1 sees level 0 up to its column and its own column's cells at levels 1..l. Each
cell therefore sees exactly one token at every position between the anchor and itself: a
consistent, if guessed, context.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

import goose
from goose.config import GooseConfig
from goose.contract.candidates import DecodeContext, Draft
from goose.contract.outcome import AuxiliaryRows, VerifyOutcome
from goose.hookspecs import Register
from goose.sources.toolkit import before_eos

NAME = "lookahead"


class LookaheadOptions(BaseModel):
    """Options of the lookahead source (``GooseConfig.source_options["lookahead"]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(default=7, ge=1, description="W: Jacobi window width (columns), the paper's default 7")
    ngram: int = Field(
        default=5, ge=2, description="N: n-gram size; the window keeps N-1 levels and drafts N-1 tokens per n-gram"
    )
    max_candidates: int = Field(default=7, ge=1, description="G: most n-grams drafted per cycle (merged into a trie)")
    pool_cap: int | None = Field(
        default=None, ge=1,
        description="n-grams remembered per first token, least recently seen dropped first; None = max_candidates "
        "(the reference implementation's GUESS_SET_SIZE)",
    )
    pool_from_prompt: bool = Field(default=True, description="seed the pool with every N-gram of the prompt")
    pool_from_output: bool = Field(
        default=False,
        description="also add every N-gram of the generated text (prompt-lookup style; off by default, "
        "context_match already drafts from the output)",
    )
    realign: bool = Field(
        default=True,
        description="after a cycle that accepted k > 1 tokens, slide the window k-1 columns so that it stays at "
        "the positions after the new anchor (False: shift one step per cycle, like the reference code)",
    )
    persist_pool: bool = Field(default=False, description="keep the n-gram pool across requests (goose_reset)")
    seed: int = Field(default=0, description="seed of the random prompt tokens that start (and refill) the window")


def window_layout(window: int, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """Position offsets int64 [(N-1)*W] and mask bool [(N-1)*W, (N-1)*W] of the lookahead window.

    Rows are level-major: row ``l * W + j`` is level l, column j, at offset ``l + j + 1`` from the
    anchor. It sees level-0 columns 0..j (the causal Jacobi row) and its own column's levels 1..l.
    """
    levels = ngram - 1
    level = np.repeat(np.arange(levels), window)  # [a]
    column = np.tile(np.arange(window), levels)  # [a]
    offsets = level + column + 1
    same_column = column[:, None] == column[None, :]
    causal_row = (level[None, :] == 0) & (column[None, :] <= column[:, None])
    own_trajectory = same_column & (level[None, :] >= 1) & (level[None, :] <= level[:, None])
    return offsets, causal_row | own_trajectory


class NgramPool:
    """N-grams by first token: ``entries[first][continuation] = times seen``, least recently seen first.

    A continuation is the n-gram's N-1 tokens after its first. Each key keeps at most ``cap``
    continuations; a new one evicts the least recently seen (the reference implementation's
    rule), and seeing one again moves it to the back and counts it.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.entries: dict[int, OrderedDict[tuple[int, ...], int]] = {}

    def __len__(self) -> int:
        return sum(len(continuations) for continuations in self.entries.values())

    def clear(self) -> None:
        self.entries.clear()

    def add(self, ngrams: list[list[int]]) -> None:
        for first, *rest in ngrams:
            continuation = tuple(rest)
            known = self.entries.get(first)
            if known is None:
                self.entries[first] = OrderedDict({continuation: 1})
            elif continuation in known:
                known[continuation] += 1
                known.move_to_end(continuation)
            else:
                known[continuation] = 1
                if len(known) > self.cap:
                    known.popitem(last=False)

    def add_sequence(self, tokens: np.ndarray, n: int) -> None:
        """Add every n-gram of a token sequence, in order (later occurrences count as more recent)."""
        if tokens.shape[0] >= n:
            self.add(np.lib.stride_tricks.sliding_window_view(tokens, n).tolist())

    def best(self, first: int, count: int) -> list[tuple[tuple[int, ...], int]]:
        """Up to ``count`` (continuation, times seen) for ``first``: most seen first, ties most recent first."""
        known = self.entries.get(first)
        if not known:
            return []
        recent_first = list(reversed(known.items()))
        return sorted(recent_first, key=lambda item: -item[1])[:count]  # stable: ties stay most recent first


class LookaheadSource:
    """Lookahead decoding's n-gram pool and Jacobi window; one instance per decoder.

    Design decisions:

    * **Window positions.** The window always stands for the W + N - 2 positions after the
      anchor. One Jacobi step moves every level down one (level l takes level l+1's tokens) and
      puts the target's predictions at the newest level into the top level; that is exactly the
      realignment a one-token advance needs. When a cycle accepts k tokens the anchor moves k
      positions, so the columns also slide k-1 to the left (``realign``); columns sliding in on
      the right are new, seeded with random prompt tokens. The reference implementation instead
      shifts one step whatever was accepted; the guesses are heuristics either way, so neither
      choice touches correctness, only which n-grams are found.
    * **Warm-up per column.** A column's n-gram is a chain of "token, target's prediction after
      it" only once its levels 1..N-2 are all the target's predictions, i.e. after N-2 Jacobi
      steps since the column was seeded. Younger columns are stepped but not harvested, so random
      seed tokens never reach the pool as drafts.
    * **Drafts.** The pool's n-grams for the anchor (most seen first, up to G) are merged into a
      trie; text after an EOS is cut (drafting EOS cannot raise the yield: the bonus token gives
      it for free). Scores: the source's acceptance estimate, split among siblings by how often
      each was seen. Pool and window are per request unless ``persist_pool``.
    """

    name = NAME

    def __init__(self, config: GooseConfig) -> None:
        self.options = LookaheadOptions.model_validate(config.options_for(NAME))
        options = self.options
        self.levels = options.ngram - 1
        self.pool = NgramPool(options.pool_cap or options.max_candidates)
        self.offsets, self.mask = window_layout(options.window, options.ngram)
        self.window: np.ndarray | None = None  # int64 [N-1, W], level 0 (oldest) first
        self.age = np.zeros(options.window, dtype=np.int64)  # Jacobi steps each column has taken since its seed
        self._seeds = np.zeros(0, dtype=np.int64)  # prompt tokens new columns are drawn from
        self._rng = np.random.default_rng(options.seed)
        self._indexed = 0  # context tokens whose n-grams are in the pool (pool_from_output)
        # statistics, for benchmarks and debugging
        self.proposals = 0
        self.matched = 0
        self.harvested = 0

    # --- hooks --------------------------------------------------------------------------------

    @goose.hookimpl
    def goose_reset(self) -> None:
        if not self.options.persist_pool:
            self.pool.clear()
        self.window = None
        self._indexed = 0

    @goose.hookimpl
    def goose_prefill(self, context: DecodeContext) -> None:
        self._start(context.tokens)
        if self.options.pool_from_prompt:
            self.pool.add_sequence(context.tokens, self.options.ngram)
        self._indexed = int(context.tokens.shape[0])

    @goose.hookimpl
    def goose_propose(self, context: DecodeContext, acceptance: float) -> Draft | None:
        tokens = context.tokens
        if self.options.pool_from_output and tokens.shape[0] > self._indexed:
            # the n-grams that end in tokens appended since the last call
            n = self.options.ngram
            self.pool.add_sequence(tokens[max(0, self._indexed - n + 1) :], n)
            self._indexed = int(tokens.shape[0])
        self.proposals += 1
        found = self.pool.best(context.anchor, self.options.max_candidates)
        eos = context.eos_token_ids
        if eos and any(not eos.isdisjoint(continuation) for continuation, _ in found):
            found = [(before_eos(continuation, eos), weight) for continuation, weight in found]
        draft = Draft.trie([path for path, _ in found], [seen for _, seen in found], acceptance)
        self.matched += draft is not None
        return draft

    @goose.hookimpl
    def goose_auxiliary_rows(self, context: DecodeContext) -> AuxiliaryRows:
        if self.window is None:  # no prefill (a caller driving the hooks by hand): start from this context
            self._start(context.tokens)
        assert self.window is not None
        return AuxiliaryRows(tokens=self.window.reshape(-1).copy(), position_offsets=self.offsets, mask=self.mask)

    @goose.hookimpl
    def goose_observe(self, outcome: VerifyOutcome, auxiliary_predictions: np.ndarray | None) -> None:
        if self.window is None:
            return
        # the anchor moved by what the cycle appended (accepted drafts + bonus); an outcome cut to
        # nothing ends the request anyway
        advance = max(1, len(outcome.new_tokens))
        if auxiliary_predictions is None or auxiliary_predictions.shape[0] != self.window.size:  # ours did not ride
            self._slide(self.window, advance)
            return
        newest = self.window.shape[1] * (self.levels - 1)
        self.jacobi_step(auxiliary_predictions[newest:].astype(np.int64), advance)

    # --- window mechanics ---------------------------------------------------------------------

    def jacobi_step(self, predictions: np.ndarray, advance: int) -> None:
        """Harvest each mature column's n-gram, then step the window and align it with the new anchor.

        ``predictions`` int64 [W]: the target's argmax at the newest level's cells (the token that
        follows each). ``advance``: how many tokens the cycle appended (the anchor moved that far).
        """
        assert self.window is not None
        grown = np.concatenate([self.window, predictions[None, :]])  # [N, W]: each column an n-gram
        mature = self.age >= self.levels - 1
        if mature.any():
            self.pool.add(grown[:, mature].T.tolist())
            self.harvested += int(mature.sum())
        self.age += 1
        # levels move down one (the top one takes the predictions): the window for a one-token advance
        shift = advance - 1 if self.options.realign else 0
        self._slide(grown[1:], shift)

    def _slide(self, window: np.ndarray, columns: int) -> None:
        """Take ``window`` moved ``columns`` to the left; columns entering on the right are new seeds."""
        width = window.shape[1]
        columns = min(max(columns, 0), width)
        if columns:
            fresh = self._rng.choice(self._seeds, size=(window.shape[0], columns))
            window = np.concatenate([window[:, columns:], fresh], axis=1)
            self.age = np.concatenate([self.age[columns:], np.zeros(columns, dtype=np.int64)])
        self.window = np.ascontiguousarray(window)

    def _start(self, tokens: np.ndarray) -> None:
        """A fresh window of random context tokens (the paper's initialisation), reproducibly."""
        self._rng = np.random.default_rng(self.options.seed)
        self._seeds = np.array(tokens, dtype=np.int64)
        self.window = self._rng.choice(self._seeds, size=(self.levels, self.options.window))
        self.age = np.zeros(self.options.window, dtype=np.int64)


@goose.hookimpl
def goose_register_sources(register: Register) -> None:
    register(NAME, LookaheadSource, description="lookahead decoding: n-grams from Jacobi iterations in the verify pass",
             initial_acceptance=0.3, options=LookaheadOptions, short_name="la")
