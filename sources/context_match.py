"""Context match (prompt lookup decoding): draft what followed the last n-gram's earlier occurrence.

Text repeats itself (code re-uses identifiers, answers quote the question, lists keep their shape),
so when the last n tokens occurred before, what followed them then is a cheap, often right guess.
The paper measures 0.07-0.60 acceptance a token for this source, well above the transition
source's, which is why planners give it the spine.

The index must cost next to nothing every cycle, even on long prompts: for each n-gram length a
dict from the n-gram's bytes to where its continuation starts, filled incrementally (the context
only grows at its end), one probe per length a lookup. The index's choice is the longest match;
then the **rules** of :data:`RULES` may choose another occurrence to copy from, each a small method
switched off by its option. A rule stays while it gains at least 1% in tau on prompts it was not
chosen on (``docs/bench/context-match-rules/report.md``): follow does; rejoin, resume and short
matches did not and went.

Every draft token gets its copy-depth estimate (:class:`CopyDepthEstimate`): how often a copy that
has shared D tokens with the present holds for one more. A fresh 3-gram hit is often chance, a copy
dozens of tokens long nearly always goes on; one estimate for both kept long spines short. Drafts
stop before the first EOS (the bonus token gives it for free). Consensus: the leading draft tokens
another occurrence (another length's, not the same one seen through a shorter n-gram) reproduces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

import goose
from goose.config import GooseConfig
from goose.contract.candidates import DecodeContext, Draft
from goose.contract.outcome import VerifyOutcome
from goose.hookspecs import Register
from goose.sources.toolkit import (
    ContextFingerprint,
    CopyDepthEstimate,
    before_eos,
    common_prefix,
    increasing_edges,
    longest_first,
    probability_ladder,
    without_trailing_repeats,
)

NAME = "context_match"
# per copy-depth bin (edges 4, 6, 8, 12, 16, 24, 32, 48, 64): the measured acceptance, rounded down
DEPTH_PRIOR = (0.7, 0.7, 0.7, 0.8, 0.9, 0.9, 0.9, 0.93, 0.93, 0.95)
DEEPEST = 512  # two occurrences are compared by their shared history up to this many tokens


class ContextMatchOptions(BaseModel):
    """Options of the context-match source (``GooseConfig.source_options["context_match"]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ngram_sizes: tuple[int, ...] = Field(
        default=(5, 4, 3), description="n-gram lengths matched; the longest that matches drafts, the others vote "
        "for consensus. (3, 2, 1) behaves like Hugging Face prompt lookup")
    max_continuation: int = Field(default=100, ge=1, description="most tokens one draft copies (the budget decides "
                                  "how much is verified)")
    occurrence: Literal["recent", "first"] = Field(default="recent", description="which earlier occurrence of an "
                                                   "n-gram the index keeps")
    depth_prior: float | tuple[float, ...] = Field(default=DEPTH_PRIOR, description="acceptance each copy-depth bin "
                                                   "starts from: one value, or one per bin (the last repeats)")
    depth_edges: tuple[int, ...] = Field(default=(4, 6, 8, 12, 16, 24, 32, 48, 64), description="copy-depth bin "
                                         "edges; () = one estimate for every draft token (the paper)")
    depth_memory: float = Field(default=50.0, ge=1.0, description="tokens of evidence a bin remembers")
    consensus_score: float = Field(default=0.9, ge=0.0, le=1.0, description="score floor of agreed tokens")
    repeat_runs: bool = Field(default=True, description="a copy reaching the context's end repeats the run")
    # the rules (RULES), each off with its own value
    follow_copy: bool = Field(default=True, description="follow: keep copying the last draft's occurrence while "
                              "every token since followed it, if it shares a longer history than the index's")

    _longest_first = field_validator("ngram_sizes")(staticmethod(longest_first))
    _ladder = field_validator("depth_prior")(staticmethod(probability_ladder))
    _increasing = field_validator("depth_edges")(staticmethod(increasing_edges))


class NgramIndex:
    """For each n-gram length, where the continuation of every n-gram seen so far starts.

    ``starts[n][key] = c`` means ``tokens[c - n:c]`` is the n-gram whose bytes are ``key``; only starts up to
    ``len(tokens) - 1`` are indexed, so the current suffix never matches itself. ``keep="recent"``: a later
    occurrence overwrites the entry; ``"first"``: the first stays.
    """

    def __init__(self, sizes: tuple[int, ...], keep: Literal["recent", "first"]) -> None:
        self.sizes, self.keep_first, self._longest = sizes, keep == "first", max(sizes)
        self.starts: dict[int, dict[bytes, int]] = {n: {} for n in sizes}
        self.indexed = 0  # continuation starts below this are in the index
        self._seen = ContextFingerprint()  # the indexed context, to notice one that does not continue it

    def clear(self) -> None:
        for starts in self.starts.values():
            starts.clear()
        self.indexed = 0
        self._seen.clear()

    def catch_up(self, tokens: np.ndarray) -> None:
        """Index the n-grams whose continuation starts at a position not yet indexed (array code, one dict update)."""
        if self.indexed and not self._seen.continued_by(tokens):
            self.clear()  # another context: the old index would draft from text that is not there
        first, last = self.indexed, tokens.shape[0] - 1  # new continuation starts: first..last
        if last < first:
            return
        for n, starts in self.starts.items():
            begin = max(first, n)
            if begin > last:
                continue
            grams = np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(tokens[begin - n:last], n),
                                         dtype=np.int64)
            keys = grams.view(np.dtype((np.void, 8 * n)))[:, 0].tolist()  # each n-gram's bytes: exact keys
            if self.keep_first:
                for key, position in zip(keys, range(begin, last + 1), strict=False):
                    starts.setdefault(key, position)
            else:
                starts.update(zip(keys, range(begin, last + 1), strict=False))  # later ones overwrite: the latest
        self.indexed = last + 1
        self._seen.record(tokens[: self.indexed])

    def matches(self, tokens: np.ndarray) -> list[tuple[int, int]]:
        """(n, continuation start) for every length whose final n-gram occurred earlier, longest first."""
        suffix = np.ascontiguousarray(tokens[-self._longest:], dtype=np.int64)
        found = [(n, self.starts[n].get(suffix[-n:].tobytes())) for n in self.sizes if n < tokens.shape[0]]
        return [(n, start) for n, start in found if start is not None]


def match_depth(tokens: np.ndarray, start: int, cap: int) -> int:
    """How many tokens just before ``start`` equal the context's last tokens, counting at most ``cap``."""
    span = min(cap, start)
    differ = np.flatnonzero(tokens[start - span:start][::-1] != tokens[tokens.shape[0] - span:][::-1])
    return int(differ[0]) if differ.size else span


@dataclass
class Copy:
    """This cycle's choice: the occurrence to copy from (n, its continuation start), its tokens, the second
    opinions (other occurrences, for consensus) and the estimate it is judged by."""

    n: int
    start: int
    tokens: list[int]
    others: list[int] = field(default_factory=list)


@dataclass
class Cycle:
    tokens: np.ndarray
    context: DecodeContext
    matches: list[tuple[int, int]]
    copy: Copy | None = None


# The rules, tried in this order after the index's choice; each is ContextMatchSource._<name>, off by its option.
RULES: tuple[tuple[str, str], ...] = (("follow", "follow_copy"),)


class ContextMatchSource:
    """Prompt-lookup drafts from an incremental n-gram index and the rules; the index is per request, the copy-depth
    estimates are kept across requests (they describe how this model's output repeats its context)."""

    name = NAME

    def __init__(self, config: GooseConfig) -> None:
        self.options = options = ContextMatchOptions.model_validate(config.options_for(NAME))
        self.index = NgramIndex(options.ngram_sizes, options.occurrence)
        self.by_depth = CopyDepthEstimate(options.depth_edges, options.depth_prior, options.depth_memory) \
            if options.depth_edges else None
        self.rules = [getattr(self, f"_{rule}") for rule, option in RULES if getattr(options, option)]
        self.goose_reset()

    @goose.hookimpl
    def goose_reset(self) -> None:
        self.index.clear()
        self.last_match_length = self.last_match_depth = self.last_consensus = 0
        self._estimate, self._first_depth = self.by_depth, 0  # the last draft's estimate and first copy depth
        self._copy_start = self._copy_context = -1  # the last draft's occurrence, and the context length then

    @goose.hookimpl
    def goose_prefill(self, context: DecodeContext) -> None:
        self.goose_reset()  # the prompt starts a new context even if goose_reset was not called
        self.index.catch_up(context.tokens)

    @goose.hookimpl
    def goose_propose(self, context: DecodeContext, acceptance: float) -> Draft | None:
        tokens = context.tokens
        self.index.catch_up(tokens)
        cycle = Cycle(tokens, context, self.index.matches(tokens))
        for n, start in cycle.matches:  # the index's choice: the longest match with something to copy
            if copied := self._continuation(tokens, start, context.eos_token_ids):
                cycle.copy = Copy(n, start, copied, [s for _, s in cycle.matches])
                break
        for rule in self.rules:
            rule(cycle)
        copy = cycle.copy
        self._first_depth, self._copy_start, self._copy_context = 0, -1, -1
        if copy is None:
            self.last_match_length = self.last_match_depth = self.last_consensus = 0
            return None
        self._copy_start, self._copy_context = copy.start, tokens.shape[0]
        self._estimate = self.by_depth
        if self._estimate is not None:
            depth = match_depth(tokens, copy.start, int(self._estimate.edges[-1]))
            estimates = self._estimate.profile(depth, len(copy.tokens))
            profile = without_trailing_repeats(estimates.tolist())
        else:  # the paper's single estimate: the decoder's
            depth, estimates, profile = copy.n, np.full(len(copy.tokens), acceptance), ()
        self._first_depth = max(depth, 1)  # 0 means "no draft"
        consensus = 0
        for other in copy.others:  # another occurrence agreeing on what comes next
            if other != copy.start and consensus < len(copy.tokens):
                consensus = max(consensus, common_prefix(copy.tokens, self._copy(tokens, other, len(copy.tokens))))
        scores = estimates.astype(np.float64)
        scores[:consensus] = np.maximum(scores[:consensus], self.options.consensus_score)
        self.last_match_length, self.last_match_depth, self.last_consensus = copy.n, depth, consensus
        return Draft.chain(copy.tokens, scores, consensus=consensus, depth_acceptance=profile)

    @goose.hookimpl
    def goose_observe(self, outcome: VerifyOutcome, own_nodes: np.ndarray) -> None:
        if self._estimate is not None and self._first_depth:
            self._estimate.observe_draft(self._first_depth, outcome, own_nodes)

    # --- the rules ------------------------------------------------------------------------------

    def _follow(self, cycle: Cycle) -> None:
        """The index keeps one occurrence per n-gram, so where the last n-gram occurs twice with different
        continuations (a quoted docstring's two example lines) it may point at the other one: while every token since
        the last draft followed its occurrence, that occurrence drafts on if it shares a longer history."""
        added = cycle.tokens.shape[0] - self._copy_context
        start = self._copy_start + added
        if self._copy_start < 0 or added <= 0 or start >= cycle.tokens.shape[0] or not np.array_equal(
                self._copy(cycle.tokens[: self._copy_context], self._copy_start, added),
                cycle.tokens[self._copy_context:]):
            return
        found = cycle.copy.start if cycle.copy is not None else -1
        if found >= 0 and (start == found or self._depth(cycle.tokens, start) <= self._depth(cycle.tokens, found)):
            return
        if copied := self._continuation(cycle.tokens, start, cycle.context.eos_token_ids):
            cycle.copy = Copy(self.last_match_length, start, copied, [s for _, s in cycle.matches])

    # --- helpers --------------------------------------------------------------------------------

    @staticmethod
    def _depth(tokens: np.ndarray, start: int) -> int:
        return match_depth(tokens, start, DEEPEST)

    def _continuation(self, tokens: np.ndarray, start: int, eos: frozenset[int]) -> list[int]:
        """Up to max_continuation tokens copied from ``start``, ending before the first EOS."""
        return list(before_eos(self._copy(tokens, start, self.options.max_continuation).tolist(), eos))

    def _copy(self, tokens: np.ndarray, start: int, count: int) -> np.ndarray:
        """``count`` tokens from ``start``; a copy reaching the context's end repeats ``tokens[start:]`` (the text is
        a run of period ``len - start``: a loop, a table row), which the same rule would draft again anyway."""
        if start + count <= tokens.shape[0] or not self.options.repeat_runs:
            return tokens[start:start + count]
        return np.resize(tokens[start:], count)  # np.resize repeats its input cyclically


@goose.hookimpl
def goose_register_sources(register: Register) -> None:
    register(NAME, ContextMatchSource, description="prompt lookup: copy what followed the last n-gram earlier",
             initial_acceptance=0.5, options=ContextMatchOptions, short_name="cm")
