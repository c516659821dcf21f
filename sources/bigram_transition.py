"""Bigram transition source: the target's own top-k, remembered from earlier forward passes.

Token Recycling's observation: every verification pass computes the target's logits at every
tree node, rejected branches included, and all but one row are thrown away. Keeping each row's
top-k, keyed by the token at that row, gives an adjacency table "after token t the target tends
to say ..." that costs nothing to fill. Goose keys it by the last *two* tokens, which
disambiguates far better ("of the" vs "in the"); the unigram rows stay as the fallback for pairs
never seen (and as the paper's "w/o bigram adjacency" ablation).

Storage is one dense, preallocated pair of arrays, so harvesting and lookup are a fixed handful
of vectorised operations whatever the number of rows. A unigram key has its own row per
vocabulary entry; bigram keys cannot (V² rows), so they are hashed into a fixed number of
buckets, and each bucket remembers which pair owns it so that a collision reads as a miss (and
falls back to the unigram row) instead of as another pair's successors. A colliding write
overwrites: the newest observation wins, as in Token Recycling.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

import goose
from goose.config import GooseConfig
from goose.contract.candidates import DecodeContext
from goose.contract.outcome import Harvest, VerifyOutcome
from goose.hookspecs import Register

NAME = "bigram_transition"

EMPTY = -1  # a token slot, or a bucket's owner key, holding nothing

# Fibonacci hashing: the high half of key * 2**64/golden-ratio (mod 2**64) mixes every key bit.
_GOLDEN64 = np.uint64(0x9E3779B97F4A7C15)
_HIGH_HALF = np.uint64(32)
MAX_VOCAB = 2**31  # keeps previous * V + token below 2**62
MAX_BUCKETS = 2**31


class BigramTransitionOptions(BaseModel):
    """Options of the bigram transition source (``GooseConfig.source_options["bigram_transition"]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    top_k: int = Field(default=10, ge=1, description="successors stored per key (paper: 10)")
    persist: bool = Field(
        default=False,
        description="keep the tables across requests (goose_reset) instead of starting each prompt empty",
    )
    unigram_only: bool = Field(
        default=False, description="key by the last token only: the paper's 'w/o bigram adjacency' ablation"
    )
    buckets: int = Field(
        default=2**18, ge=1, lt=MAX_BUCKETS, description="hash buckets of the bigram table (its row count)"
    )


def bigram_bucket(keys: np.ndarray, buckets: int) -> np.ndarray:
    """Bucket in [0, buckets) of each bigram key (int64, >= 0), as int64."""
    mixed = (keys.view(np.uint64) * _GOLDEN64) >> _HIGH_HALF  # wraps mod 2**64 by design
    return (mixed % np.uint64(buckets)).view(np.int64)


def _valid(ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """ids in [0, vocab_size), in one comparison: negative int64 ids are huge when read unsigned."""
    return ids.view(np.uint64) < vocab_size


class SuccessorTable:
    """K successor slots (int32 token, float16 score) per row, best first; -1 / 0.0 when empty.

    Rows ``[0, V)`` belong to unigram keys (row t: after token t). Rows ``[V, V + B)`` are the
    bigram buckets, and ``bigram_keys[b]`` is the owner ``previous * V + token`` of bucket b (-1:
    none). The last row is always empty: lookups with nothing to say read it, which spares a
    masking pass over the result. ``B = 0`` gives a unigram-only table.
    """

    def __init__(self, vocab_size: int, buckets: int, width: int) -> None:
        if not 0 < vocab_size < MAX_VOCAB:
            raise ValueError(f"vocab_size must be in [1, 2**31) for the bigram keys, got {vocab_size}")
        self.vocab_size, self.buckets, self.width = vocab_size, buckets, width
        self.empty_row = vocab_size + buckets
        self.tokens = np.full((self.empty_row + 1, width), EMPTY, dtype=np.int32)
        self.scores = np.zeros((self.empty_row + 1, width), dtype=np.float16)
        self.bigram_keys = np.full((buckets,), EMPTY, dtype=np.int64)
        # Rows written since the last clear: a request touches a few thousand rows of a table of
        # hundreds of thousands, so clearing only those is far cheaper than refilling the table.
        # Past an eighth of the table the list is dropped (bounding its memory) and the next clear
        # fills everything.
        self._written: list[np.ndarray] | None = []
        self._written_count = 0

    @property
    def unigram_tokens(self) -> np.ndarray:
        return self.tokens[: self.vocab_size]

    @property
    def bigram_tokens(self) -> np.ndarray:
        return self.tokens[self.vocab_size : self.empty_row]

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.scores.nbytes + self.bigram_keys.nbytes

    def clear(self) -> None:
        if self._written is None:
            self.tokens.fill(EMPTY)
            self.scores.fill(0.0)
            self.bigram_keys.fill(EMPTY)
        elif self._written:
            rows = np.concatenate(self._written)
            self.tokens[rows] = EMPTY
            self.scores[rows] = 0.0
            self.bigram_keys[rows[rows >= self.vocab_size] - self.vocab_size] = EMPTY
        self._written, self._written_count = [], 0

    def _remember_written(self, rows: np.ndarray) -> None:
        if self._written is None:
            return
        self._written_count += rows.shape[0]
        if self._written_count > self.tokens.shape[0] // 8:
            self._written = None
        else:
            self._written.append(rows)

    def lookup(self, previous: np.ndarray, tokens: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Successors of each (previous, token): the bigram row if the pair owns its bucket, else the
        unigram row, else nothing. Returns (tokens int64 [m, width], scores float32 [m, width], bigram hits).
        """
        vocab = self.vocab_size
        known = _valid(tokens, vocab)
        rows = np.where(known, tokens, self.empty_row)
        hits = 0
        if self.buckets:
            keys = previous * vocab + tokens  # garbage for invalid pairs, which `owned` rules out
            buckets = bigram_bucket(keys, self.buckets)
            owned = known & _valid(previous, vocab) & (self.bigram_keys[buckets] == keys)
            rows = np.where(owned, buckets + vocab, rows)
            hits = int(np.count_nonzero(owned))
        return self.tokens[rows, :width].astype(np.int64), self.scores[rows, :width].astype(np.float32), hits

    def write(self, previous: np.ndarray, tokens: np.ndarray, top_tokens: np.ndarray,
              top_scores: np.ndarray) -> None:
        """Store each row's top-k under its unigram key and, when ``previous`` is known, its bigram key.

        Where several rows land on the same table row, the last one wins (numpy leaves the winner
        of a repeated fancy-index assignment unspecified, so the repeats are removed first).
        """
        vocab = self.vocab_size
        top_tokens, top_scores = self._fit(top_tokens, top_scores)
        known = _valid(tokens, vocab)
        rows, sources = tokens[known], np.flatnonzero(known)
        owners = np.full(rows.shape[0], EMPTY, dtype=np.int64)
        if self.buckets:
            pair = known & _valid(previous, vocab)
            keys = previous[pair] * vocab + tokens[pair]
            rows = np.concatenate([rows, bigram_bucket(keys, self.buckets) + vocab])
            sources = np.concatenate([sources, np.flatnonzero(pair)])
            owners = np.concatenate([owners, keys])
        if rows.shape[0] == 0:
            return
        _, first_from_end = np.unique(rows[::-1], return_index=True)
        last = rows.shape[0] - 1 - first_from_end
        rows, sources, owners = rows[last], sources[last], owners[last]
        self.tokens[rows] = top_tokens[sources]
        self.scores[rows] = top_scores[sources]
        in_bigram = rows >= vocab
        self.bigram_keys[rows[in_bigram] - vocab] = owners[in_bigram]
        self._remember_written(rows)

    def _fit(self, top_tokens: np.ndarray, top_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Harvested top-k cut or padded to the table width; ids outside the vocabulary emptied
        (a padded lm_head can rank ids the tokenizer does not have; they must never be drafted)."""
        count, width = top_tokens.shape[0], self.width
        tokens = np.full((count, width), EMPTY, dtype=np.int32)
        scores = np.zeros((count, width), dtype=np.float16)
        kept = min(width, top_tokens.shape[1])
        inside = _valid(top_tokens[:, :kept], self.vocab_size)
        tokens[:, :kept] = np.where(inside, top_tokens[:, :kept], EMPTY)
        scores[:, :kept] = np.where(inside, top_scores[:, :kept], 0.0)
        return tokens, scores


class BigramTransitionSource:
    """Branch successors from a table filled by harvesting the target's top-k; one per decoder.

    Design decisions:

    * **Lookup.** ``goose_successors`` answers each (previous, token) pair with its bigram row
      when the pair owns its bucket, else the token's unigram row; -1 / 0.0 where nothing is
      known. Scores are the target's softmax over its kept top-k at harvest time.
    * **No spine.** The source implements no ``goose_propose``: it branches, and a hook it does
      not implement costs the decoder nothing per cycle. A planner that wants transition tokens
      on the spine can chain successors itself.
    * **Lifetime.** The table is allocated at the first prefill, when the vocabulary size is known
      (again if it changes), and cleared by ``goose_reset`` unless ``persist``: cleared by default
      so that a request's speed does not depend on the requests before it.
    * **Memory.** (V + buckets + 1) * K * 6 + buckets * 8 bytes: 33.6 MB for Gemma 3's
      262,144-token vocabulary with the defaults (15.7 MB of it unigram), bounded by
      ``buckets``, not V².
    """

    name = NAME

    def __init__(self, config: GooseConfig) -> None:
        self.options = BigramTransitionOptions.model_validate(config.options_for(NAME))
        self.table: SuccessorTable | None = None
        # lookup statistics: how often the bigram row answered instead of the unigram fallback
        self.lookups = 0
        self.bigram_hits = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the table (0 before the first prefill)."""
        return self.table.nbytes if self.table is not None else 0

    # --- hooks --------------------------------------------------------------------------------

    @goose.hookimpl
    def goose_reset(self) -> None:
        if self.table is not None and not self.options.persist:
            self.table.clear()

    @goose.hookimpl
    def goose_prefill(self, context: DecodeContext, harvest: Harvest) -> None:
        if self.table is None or self.table.vocab_size != context.vocab_size:
            buckets = 0 if self.options.unigram_only else self.options.buckets
            self.table = SuccessorTable(context.vocab_size, buckets, self.options.top_k)
        self.absorb(harvest)

    @goose.hookimpl
    def goose_successors(self, previous: np.ndarray, tokens: np.ndarray,
                         k: int) -> tuple[np.ndarray, np.ndarray] | None:
        width = min(k, self.options.top_k)
        if self.table is None or width <= 0:  # before the first prefill nothing is known
            return None
        successors, scores, hits = self.table.lookup(previous, tokens, width)
        self.lookups += successors.shape[0]
        self.bigram_hits += hits
        return successors, scores

    @goose.hookimpl
    def goose_observe(self, outcome: VerifyOutcome) -> None:
        self.absorb(outcome.harvest)

    # --- harvesting ---------------------------------------------------------------------------

    def absorb(self, harvest: Harvest) -> None:
        """Write every harvested row's top-k into the table (a no-op before the first prefill)."""
        if self.table is None or len(harvest) == 0:
            return
        self.table.write(harvest.previous, harvest.tokens, harvest.top_tokens, harvest.top_scores)


@goose.hookimpl
def goose_register_sources(register: Register) -> None:
    register(NAME, BigramTransitionSource, description="top-k successors harvested from the target, keyed by bigram",
             initial_acceptance=0.05, shareable=True, options=BigramTransitionOptions, short_name="bt")
