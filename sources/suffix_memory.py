"""Suffix memory: draft what followed the context's longest suffix in earlier requests and in this one.

Repeated and agentic workloads (the same tool calls, the same code shapes, request after request)
repeat across requests what context match can only see within one. In the spirit of
SuffixDecoding's global tree (Oliaro et al., 2024), this source keeps a memory of earlier
requests' outputs (:class:`goose.sources.toolkit.ngram_memory.NgramMemory`: bounded by ``capacity`` tokens,
oldest requests evicted first, optionally saved to a file) together with the current prompt and
output, and each cycle:

1. **Longest suffix.** Finds the longest of ``ngram_sizes`` whose last tokens of the context
   occurred before, in this request or an earlier one (one dict probe and one binary search per
   size).
2. **Frequency tree.** Reads what followed its ``max_occurrences`` newest occurrences, cut at
   EOS and at document ends, and merges them into a trie with counts
   (:func:`goose.sources.toolkit.frequency_trie`): each node's empirical probability is
   count(node) / count(parent), P(token | matched suffix + path). Not one chain: a memory of
   many requests knows several ways a shape goes on.
3. **Depth by match length.** As in SuffixDecoding, a draft goes at most
   ``depth_per_match_token`` tokens deep per matched token (and ``max_depth``): a 2-token match
   says little about the tenth token after it, a 24-token match a lot.
4. **Pruning.** Nodes whose path probability (product of empirical probabilities from the
   anchor) falls below ``min_probability`` are dropped, then the ``max_nodes`` most frequent are
   kept (ancestors always kept, so the trie stays connected).

**Scores and the acceptance estimate.** Empirical probabilities from a handful of occurrences
are overconfident (one occurrence gives 1.0), and how far a match goes on depends on how long it
already is, so the source learns acceptance per bin of *match depth* (how many tokens the
context shares with the occurrences when a draft token is due: the matched length for the first
draft token, one more per draft token before it) from its own tested tokens, with the estimator
context match uses (:class:`goose.sources.toolkit.CopyDepthEstimate`). The most frequent
child of a node scores its bin's rate, and a sibling the rate times its count relative to the
most frequent one: the topologies verify mostly the most valuable root path, so the rates are
learned on most-frequent children, and multiplying them by the empirical probability as well
would count the same doubt twice (measured: lower tau). The draft's best root path's scores are
reported per depth (``Draft.depth_acceptance``): the draft is ranked by them (their
chain-equivalent rate) and the automatic budget sizes the spine by them. The estimates are kept
across requests; the decoder's shared estimate (an EMA over every draft) is what ``goose_propose``
receives, and is not used by this source.

**Across requests.** When a request ends (the next ``goose_reset`` or ``goose_prefill``), its
output, led in by the prompt's last ``lead_in`` tokens so that the first cycles of a similar
request can match, joins the memory. With ``path`` the memory is loaded from that file when the
decoder is made and written back after every request and at exit; a file written for another
tokenizer is refused (and left untouched). With ``share`` several sources of one process (a
serving engine's drafters, one per running request) remember into and search one archive of
earlier requests (:class:`goose.sources.toolkit.ngram_memory.RequestArchive`).
"""

from __future__ import annotations

import atexit
import logging
import math
import weakref
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

import goose
from goose.config import GooseConfig
from goose.contract.candidates import DecodeContext, Draft
from goose.contract.outcome import VerifyOutcome
from goose.hookspecs import Register
from goose.sources.toolkit import (
    CopyDepthEstimate,
    FrequencyTrie,
    context_identity,
    cut_at_stops,
    frequency_trie,
    increasing_edges,
    longest_first,
    same_tokenizer,
    without_trailing_repeats,
)
from goose.sources.toolkit.ngram_memory import MemoryFileError, NgramMemory, RequestArchive

NAME = "suffix_memory"

logger = logging.getLogger("goose.sources.suffix_memory")


class SuffixMemoryOptions(BaseModel):
    """Options of the suffix-memory source (``GooseConfig.source_options["suffix_memory"]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ngram_sizes: tuple[int, ...] = Field(
        default=(32, 24, 16, 12, 8, 6, 4, 3, 2),
        description="suffix lengths searched, longest first: the longest one that occurred before drafts")
    capacity: int = Field(
        default=200_000, ge=0,
        description="tokens of earlier requests kept (oldest requests evicted first); 0: only the current request")
    search_current: bool = Field(
        default=True, description="also draft from the current prompt and output (False: earlier requests only, "
        "for a decoder whose context match covers the current request)")
    lead_in: int = Field(default=8, ge=0, description="prompt tokens kept before each remembered output")
    max_occurrences: int = Field(default=64, ge=1, description="newest occurrences of the suffix merged into the tree")
    max_depth: int = Field(default=16, ge=1, description="deepest draft token")
    depth_per_match_token: float = Field(
        default=4.0, gt=0.0, description="draft depth allowed per matched suffix token (SuffixDecoding's factor; "
        "the match-depth estimates, not this cap, decide how much of a draft is verified)")
    max_nodes: int = Field(default=32, ge=1, description="most draft nodes (the most frequent are kept)")
    min_probability: float = Field(
        default=0.1, ge=0.0, le=1.0, description="drop nodes whose empirical path probability is below this")
    depth_prior: float = Field(
        default=0.5, ge=0.0, le=1.0, description="acceptance every match-depth bin starts from")
    depth_edges: tuple[int, ...] = Field(
        default=(3, 4, 6, 8, 12, 16, 24, 32, 48), min_length=1,
        description="match-depth bin edges: one acceptance estimate per bin of how many tokens the context shares "
        "with the occurrences when a draft token is due")
    depth_memory: float = Field(
        default=50.0, ge=1.0, description="tokens of evidence each match-depth bin remembers (older ones fade)")
    path: Path | None = Field(
        default=None, description="memory file (.npz): loaded when the decoder is made, written after each request")
    share: str | None = Field(
        default=None, min_length=1,
        description="a name: the suffix-memory sources of this process given the same name (and the same "
        "ngram_sizes and capacity) remember into and search one archive of earlier requests, each keeping its own "
        "current request; e.g. the vLLM proposer's drafters, one per running request. They must run in one thread. "
        "With path, the first of them loads the file. None: an archive of this source's own")

    _longest_first = field_validator("ngram_sizes")(staticmethod(longest_first))
    _increasing = field_validator("depth_edges")(staticmethod(increasing_edges))


class MemoryDraft:
    """A pruned frequency trie with per-node scores: what the source turns into a ``Draft``."""

    def __init__(self, trie: FrequencyTrie, match_size: int, estimate: CopyDepthEstimate,
                 min_probability: float) -> None:
        # a node's score is its count over its parent's, so its path's product telescopes to count / total
        path_probability = trie.counts / trie.total
        keep = path_probability >= min_probability  # non-increasing along paths: ancestors are kept
        renumber = np.cumsum(keep) - 1
        parents = trie.parents[keep]
        self.tokens = trie.tokens[keep]
        self.parents = np.where(parents >= 0, renumber[np.maximum(parents, 0)], -1)
        self.depths = trie.depths[keep]
        rates = estimate.rates[estimate.bins(match_size + self.depths - 1)]
        # the most frequent child of a node scores its bin's rate, a sibling its share relative to it
        probability = trie.scores[keep].astype(np.float64)
        most = np.zeros(len(self.tokens) + 1)
        np.maximum.at(most, self.parents + 1, probability)
        self.scores = np.minimum(1.0, rates * probability / most[self.parents + 1])

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def to_draft(self) -> Draft:
        """The trie as a ``Draft`` whose per-depth estimates are the scores along its most valuable root path."""
        draft = Draft(tokens=self.tokens.astype(np.int64), parents=self.parents.astype(np.int64), scores=self.scores)
        _, reach = draft.best_path  # products of scores from the anchor: back to one score per depth
        before = np.concatenate([[1.0], reach[:-1]])
        scores = np.divide(reach, before, out=np.zeros_like(reach), where=before > 0)
        return replace(draft, depth_acceptance=without_trailing_repeats(scores.tolist()))


# archives shared by name (the ``share`` option); one lives while a source holds it
_SHARED: weakref.WeakValueDictionary[str, RequestArchive] = weakref.WeakValueDictionary()


def shared_archive(name: str, sizes: Sequence[int], capacity: int) -> tuple[RequestArchive, bool]:
    """The archive shared under ``name`` (made now if no source holds one), and whether it was made now.

    The memory built on it checks that its sizes and capacity are the archive's.
    """
    archive = _SHARED.get(name)
    if archive is None:
        archive = _SHARED[name] = RequestArchive(sizes, capacity)
        return archive, True
    return archive, False


class SuffixMemorySource:
    """Frequency-weighted trie drafts from a memory of earlier requests and the current one; one per decoder."""

    name = NAME

    def __init__(self, config: GooseConfig) -> None:
        self.options = options = SuffixMemoryOptions.model_validate(config.options_for(NAME))
        archive, fresh = None, True
        if options.share is not None:
            archive, fresh = shared_archive(options.share, options.ngram_sizes, options.capacity)
        self.memory = NgramMemory(options.ngram_sizes, options.capacity, options.search_current, archive)
        self._file_tokenizer: dict[str, Any] | None = None  # whom the loaded file was written for
        if options.path is not None and options.path.exists() and fresh:
            self.memory, header = NgramMemory.load(options.path, options.ngram_sizes, options.capacity,
                                                   options.search_current, archive)
            self._file_tokenizer = header.get("tokenizer")
        self._tokenizer: dict[str, Any] | None = None  # the model's, once seen
        self._saving = options.path is not None
        self.by_depth = CopyDepthEstimate(options.depth_edges, options.depth_prior, options.depth_memory)
        self._prompt_length: int | None = None  # of the request in progress; None: none
        self._match_size = 0  # this cycle's match; 0: nothing drafted
        # statistics, for benchmarks and debugging
        self.proposals = 0
        self.matched = 0
        self.remembered_requests = 0
        self.last_match_size = 0
        self.last_occurrences = 0
        if self._saving:  # the last request of a process is only finished at exit
            reference = weakref.ref(self)
            atexit.register(lambda: (source := reference()) is not None and source.flush())

    # --- hooks --------------------------------------------------------------------------------

    @goose.hookimpl
    def goose_reset(self) -> None:
        self._finish_request()

    @goose.hookimpl
    def goose_prefill(self, context: DecodeContext) -> None:
        self._finish_request()  # a new prompt ends the previous request even without goose_reset
        self._prompt_length = context.prompt_length
        self.memory.follow(context.tokens)
        self._check_file(context)

    @goose.hookimpl
    def goose_propose(self, context: DecodeContext) -> Draft | None:
        self.memory.follow(context.tokens)
        self.proposals += 1
        self._match_size = 0
        match = self.memory.longest_match(self.options.max_occurrences)
        self.last_match_size = match.size if match is not None else 0
        self.last_occurrences = match.count if match is not None else 0
        if match is None:
            return None
        options = self.options
        depth = min(options.max_depth, max(1, math.ceil(options.depth_per_match_token * match.size)))
        rows = cut_at_stops(self.memory.continuations(match, options.max_occurrences, depth),
                            context.eos_token_ids, context.vocab_size)
        trie = frequency_trie(rows, options.max_nodes)
        if not len(trie):
            return None
        draft = MemoryDraft(trie, match.size, self.by_depth, options.min_probability)
        if not len(draft):
            return None
        self.matched += 1
        self._match_size = match.size
        return draft.to_draft()

    @goose.hookimpl
    def goose_observe(self, outcome: VerifyOutcome, own_nodes: np.ndarray) -> None:
        self.memory.extend(outcome.new_tokens)  # the request's last tokens arrive here, not in a context
        if self._match_size:
            self.by_depth.observe_draft(self._match_size, outcome, own_nodes)

    # --- the memory across requests -----------------------------------------------------------

    def flush(self) -> None:
        """Finish the request in progress: its output joins the memory (and the file, with ``path``)."""
        self._finish_request()

    def _finish_request(self) -> None:
        if self._prompt_length is not None and self.memory.live.shape[0] > self._prompt_length:
            lead_in = max(0, self._prompt_length - self.options.lead_in)
            self.memory.remember(self.memory.live[lead_in:].copy())
            self.remembered_requests += 1
            self._save()
        self.memory.start_request()
        self._prompt_length = None
        self._match_size = 0

    def _save(self) -> None:
        if not self._saving or self.options.path is None or self._tokenizer is None:
            return
        try:
            self.memory.save(self.options.path, {"tokenizer": self._tokenizer})
        except OSError as error:
            self._saving = False
            logger.warning("suffix_memory: cannot write %s (%s); the memory is no longer saved", self.options.path,
                           error)

    def _check_file(self, context: DecodeContext) -> None:
        """Refuse a loaded memory written for another tokenizer: its ids mean other tokens here.

        Raises once (the decoder logs it and goes on; this source drafts from the current requests
        only), and never writes over that file.
        """
        if self._tokenizer is not None or self.options.path is None:
            return
        self._tokenizer = context_identity(context)
        written = self._file_tokenizer
        if written is None or same_tokenizer(written, self._tokenizer):
            return
        self.memory.clear()
        self._saving = False
        raise MemoryFileError(
            f"suffix_memory: {self.options.path} was written for tokenizer {written.get('name')!r} (vocabulary "
            f"{written.get('vocab_size')}), not this model's {self._tokenizer['name']!r} (vocabulary "
            f"{self._tokenizer['vocab_size']}); token ids differ between tokenizers, so it is not used and not "
            "overwritten: give another path for this model")


@goose.hookimpl
def goose_register_sources(register: Register) -> None:
    register(NAME, SuffixMemorySource,
             description="SuffixDecoding-style memory: frequency trie of what followed the suffix, across requests",
             initial_acceptance=0.5, options=SuffixMemoryOptions, short_name="sm",
             # beside context match it searches earlier requests only: searching the current one too, it finds the
             # copies context match finds and takes the spine from it for the same tokens (round 6 of
             # docs/results.md: context match's yield fell from 0.97 to 0.42 tokens a pass)
             beside={"context_match": {"search_current": False}})
