"""REST: retrieval-based drafts: what followed the context's last tokens in a corpus.

Context match copies from the prompt and the output; REST (He et al., "REST: Retrieval-Based
Speculative Decoding", 2023) copies from a *datastore*: a corpus tokenized in the target's
tokenizer with a suffix array (:mod:`goose.sources.rest.datastore`, built by
:mod:`goose.sources.rest.corpus`, ``goose datastore build``). Each cycle:

1. **Longest suffix.** The longest suffix of the context, ``max_span`` down to ``min_span``
   tokens, that occurs in the datastore (one vectorised binary search over the suffix array for
   all spans at once, :meth:`goose.sources.rest.suffix_index.SuffixIndex.longest_match`). A
   longer shared history makes the continuations more specific, so the longest span wins even
   when a shorter one has more occurrences. With ``learn_outputs`` the side store (below) is
   searched the same way; the longer of the two matches drafts, and on a tie both do.
2. **Occurrences.** Up to ``max_occurrences`` of the match, sampled at an even stride over its
   suffix-array range (the range is sorted by what follows, so its first entries would be a
   biased sample), each read for its next ``continuation_length`` tokens.
3. **Frequency trie.** The continuations are cut at a document end, at EOS and at ids outside
   the model's vocabulary (:func:`goose.sources.toolkit.cut_at_stops`) and merged into a trie
   with counts by :func:`goose.sources.toolkit.frequency_trie`: one lexicographic sort of the
   rows, where a row opens a node at every depth from its first difference with the row before
   it, then the ``max_nodes`` nodes with the highest counts (ties: shallower first, which keeps
   every kept node's ancestors); array operations throughout, never a Python loop over
   continuations. Each node's score is count(node) / count(parent): the datastore's conditional
   frequency of that token after its path, which is what planners expect a score to estimate.
   The draft is that trie (no ``depth_acceptance``: the source is ranked by the decoder's
   estimate); a chain planner takes its most valuable root path.

The datastore is opened (memory-mapped) once per decoder, at the first ``goose_prefill``, and
checked against the model's tokenizer (``DecodeContext.tokenizer``): a datastore built for
another tokenizer is refused with a message that says how to rebuild it. Without a
``datastore`` option the default one, the Python standard library, is built on first use and
cached (see :func:`goose.sources.rest.corpus.default_datastore`); no benchmark answers are in it.

``learn_outputs`` adds a small in-memory side store: when a request ends, its output (led in by
the prompt's last ``max_span`` tokens, so the first cycles of a similar request can match) joins
a suffix index that is searched like the datastore, across the requests of this decoder, up to
``learn_capacity`` tokens (oldest outputs dropped first). The side store's suffix array is
rebuilt once per request, never per cycle.

Draft scores are the datastore's conditional frequencies, not the source's acceptance estimate:
they already say how the continuations compare.
"""

from __future__ import annotations

import argparse
from collections import deque
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

import goose
from goose.config import GooseConfig
from goose.contract.candidates import DecodeContext, Draft
from goose.contract.outcome import VerifyOutcome
from goose.hookspecs import Register
from goose.sources.rest.corpus import default_datastore
from goose.sources.rest.datastore import Datastore
from goose.sources.rest.suffix_index import DatastoreError, SuffixIndex
from goose.sources.toolkit import cut_at_stops, frequency_trie

NAME = "rest"


class RestOptions(BaseModel):
    """Options of the REST source (``GooseConfig.source_options["rest"]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    datastore: Path | None = Field(
        default=None, description="datastore folder (goose datastore build); None: the Python standard library, "
        "built for the model's tokenizer on first use and cached")
    max_span: int = Field(default=16, ge=1, le=256, description="longest context suffix searched")
    min_span: int = Field(default=2, ge=1, description="shortest context suffix that may draft")
    max_occurrences: int = Field(default=2000, ge=1, description="occurrences (evenly sampled) merged into the trie")
    continuation_length: int = Field(default=10, ge=1, le=256, description="tokens taken after each occurrence")
    max_nodes: int = Field(default=64, ge=1, description="trie nodes kept (the most frequent)")
    learn_outputs: bool = Field(default=False, description="also retrieve from this decoder's earlier outputs")
    learn_capacity: int = Field(default=200_000, ge=1, description="tokens of earlier outputs kept for learn_outputs")
    cache_dir: Path | None = Field(
        default=None, description="where the default datastore is cached (None: the goose cache directory)")

    @model_validator(mode="after")
    def _spans_ordered(self) -> RestOptions:
        if self.min_span > self.max_span:
            raise ValueError(f"min_span ({self.min_span}) must not exceed max_span ({self.max_span})")
        return self


class RestSource:
    """Drafts a frequency trie of the datastore's continuations of the context's longest matching suffix."""

    name = NAME

    def __init__(self, config: GooseConfig) -> None:
        self.options = RestOptions.model_validate(config.options_for(NAME))
        # an explicit datastore is opened here so that a wrong path fails when the decoder is made,
        # not silently in a hook; the tokenizer check waits for the first context
        self.store: Datastore | None = Datastore.open(self.options.datastore) if self.options.datastore else None
        self._bound = False  # the store has been checked against the model's tokenizer
        self._failure: str | None = None  # why the datastore cannot be used (logged once by the decoder)
        # learn_outputs: earlier requests' outputs and their suffix index
        self.learned: deque[np.ndarray] = deque()
        self.learned_tokens = 0
        self.side: SuffixIndex | None = None
        self._output: list[int] = []  # this request's lead-in and output so far
        # statistics of the latest proposal, for benchmarks and debugging
        self.last_span = 0  # length of the matched suffix; 0 = no match
        self.last_occurrences = 0
        self.proposals = 0
        self.matched = 0

    # --- hooks --------------------------------------------------------------------------------

    @goose.hookimpl
    def goose_reset(self) -> None:
        self._learn_output()
        self.last_span = self.last_occurrences = 0

    @goose.hookimpl
    def goose_prefill(self, context: DecodeContext) -> None:
        self._learn_output()  # a new prompt ends the previous request even without goose_reset
        if self.options.learn_outputs:
            lead_in = context.tokens[max(0, context.prompt_length - self.options.max_span) :]
            self._output = lead_in.tolist()
        self._bind(context)

    @goose.hookimpl
    def goose_propose(self, context: DecodeContext) -> Draft | None:
        if self._bind(context) is None:
            return None
        self.proposals += 1
        options = self.options
        tail = context.tokens[-options.max_span :]
        indexes = [index for index in (self.store, self.side) if index is not None]
        matches = [(index, index.longest_match(tail, options.min_span, options.max_span)) for index in indexes]
        found = [(index, match) for index, match in matches if match is not None]
        if not found:
            self.last_span = self.last_occurrences = 0
            return None
        span = max(match.span for _, match in found)
        continuations = np.concatenate([
            index.continuations(match, options.max_occurrences, options.continuation_length)
            for index, match in found if match.span == span
        ])
        trie = frequency_trie(cut_at_stops(continuations, context.eos_token_ids, context.vocab_size), options.max_nodes)
        self.last_span, self.last_occurrences = span, sum(m.count for _, m in found if m.span == span)
        if not len(trie):
            return None
        self.matched += 1
        return Draft(tokens=trie.tokens, parents=trie.parents, scores=trie.scores)

    @goose.hookimpl
    def goose_observe(self, outcome: VerifyOutcome) -> None:
        if self.options.learn_outputs and self._output:
            self._output.extend(outcome.new_tokens)

    # --- helpers ------------------------------------------------------------------------------

    def _bind(self, context: DecodeContext) -> SuffixIndex | None:
        """The datastore, opened or built and checked against the model's tokenizer once; None if unusable.

        Raises the first time it fails (the decoder logs it once and goes on without this source's
        drafts); afterwards answers None so that the failure costs nothing per cycle.
        """
        if self._bound:
            return self.store
        if self._failure is not None:
            return None
        tokenizer = context.tokenizer
        try:
            if self.store is None:
                if tokenizer is None:
                    raise DatastoreError("rest: no datastore given and no tokenizer to build the default one; set "
                                         "source_options.rest.datastore to a folder from `goose datastore build`")
                self.store = default_datastore(tokenizer, self.options.cache_dir)
            elif tokenizer is not None:
                self.store.check_tokenizer(tokenizer)
            else:
                self.store.check_vocab(context.vocab_size)
        except DatastoreError as error:
            self._failure = str(error)
            raise
        self._bound = True
        return self.store

    def _learn_output(self) -> None:
        """Add the finished request's output to the side store (learn_outputs) and rebuild its index."""
        output, self._output = self._output, []
        if not self.options.learn_outputs or len(output) <= self.options.min_span:
            return
        capacity = self.options.learn_capacity
        sequence = np.asarray(output[-capacity:], dtype=np.int64)
        self.learned.append(sequence)
        self.learned_tokens += sequence.shape[0]
        while self.learned_tokens > capacity and len(self.learned) > 1:
            self.learned_tokens -= self.learned.popleft().shape[0]
        self.side = SuffixIndex.from_documents(self.learned)


@goose.hookimpl
def goose_register_sources(register: Register) -> None:
    register(NAME, RestSource, description="REST: continuations of the context's longest suffix in a datastore",
             initial_acceptance=0.3, options=RestOptions)


def _datastore_command(parser: argparse.ArgumentParser) -> None:
    from goose.sources.rest.cli import add_arguments  # imported when the command line is built, not with the source

    add_arguments(parser)


@goose.hookimpl
def goose_register_commands(register: Register) -> None:
    register("datastore", _datastore_command, description="build or describe a retrieval datastore for the rest source")


__all__ = ["NAME", "RestOptions", "RestSource"]
