"""Context match (prompt lookup decoding): draft what followed the last n-gram's earlier occurrence.

Text repeats itself (code re-uses identifiers, answers quote the question, lists keep their
shape), so when the last n tokens occurred before, the tokens that followed them then are a
cheap, often right guess for what follows now. The paper measures 0.07–0.60 per-token
acceptance for this source, well above the transition source, which is why planners give it
the spine.

The search must cost next to nothing every cycle even on long prompts (a Python scan per cycle
made the reference sketch slower than plain prompt lookup on ClassEval), so the source keeps an
incremental hash index: for each n-gram length, a dict from the n-gram to where its continuation
starts. The decoder's context only grows by appending, so each cycle indexes just the few new
tokens; a lookup is one dict probe per length.
"""

from __future__ import annotations

from typing import Any, Literal

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

class ContextMatchOptions(BaseModel):
    """Options of the context-match source (``GooseConfig.source_options["context_match"]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ngram_sizes: tuple[int, ...] = Field(
        default=(5, 4, 3),
        description="n-gram lengths matched against the context; the longest that matches drafts, the others "
        "vote for consensus. Stored longest first. (3, 2, 1) behaves like Hugging Face prompt lookup",
    )
    short_sizes: tuple[int, ...] = Field(
        default=(2, 1),
        description="shorter n-gram lengths, tried in the answer's opening (short_window) when no length of "
        "ngram_sizes matches and no copy goes on, and only where the n-gram occurred exactly once (lengths not "
        "below ngram_sizes' shortest are ignored). A quoted function's first line follows the output's own "
        "fence (```python), which the prompt does not have: `def` and its name match only as a 1- or 2-gram. "
        "() = never",
    )
    short_window: int = Field(
        default=16, ge=0,
        description="output tokens from the start in which short matches are tried: where an answer quotes the "
        "prompt's signature after its own preamble; later a quote in progress shares 3-grams, and a short "
        "match is mostly chance (docs/bench/official-peer/qwen15b-float32-20.md)",
    )
    short_prior: float | tuple[float, ...] = Field(
        default=0.3,
        description="acceptance each copy-depth bin of a short match starts from (see depth_prior); short "
        "drafts learn their own estimate",
    )
    max_continuation: int = Field(
        default=100, ge=1,
        description="most tokens one draft copies (paper: 20; the paper's code extends a confident chain to 100). "
        "Longer here because deep matches are trusted by their own estimate (depth_edges): the budget decides "
        "how much of a draft is verified",
    )
    occurrence: Literal["recent", "first"] = Field(
        default="recent", description="which earlier occurrence of an n-gram to copy from: the latest or the earliest"
    )
    depth_prior: float | tuple[float, ...] = Field(
        default=DEPTH_PRIOR,
        description="acceptance each copy-depth bin starts from: one value, or one per bin (the last repeats). "
        "The default is what SmolLM2-135M's copies did over 20 prompts of the five datasets (float32, budget "
        "60; docs/results.md): a fresh match holds about 3 tokens in 4, a copy past 12 tokens nearly always",
    )
    consensus_score: float = Field(
        default=0.9, ge=0.0, le=1.0,
        description="score floor of tokens that at least two n-gram lengths agree on",
    )
    follow_copy: bool = Field(
        default=True,
        description="when every token since the last draft followed that draft's occurrence, keep copying from it "
        "if it shares a longer history with the present than the occurrence the index found (the index keeps one "
        "occurrence per n-gram, the latest: a quoted docstring's second example line would otherwise be drafted from "
        "its first)",
    )
    resume_copy: int = Field(
        default=12, ge=0,
        description="when a copy that held for at least this many tokens breaks on a token the target wrote in "
        "place of the copied text (two newlines for three, another literal) and the index finds nothing, draft the "
        "copy on from where that text ends: copied text usually resumes after a small edit. 12: where a copy's "
        "acceptance reaches 0.8 a token (depth_prior); a fresh match that broke was chance. 0: never",
    )
    rejoin_copy: int = Field(
        default=16, ge=0,
        description="for this many tokens after a copy that held for resume_copy tokens breaks, an n-gram that also "
        "occurs in the copied text within this many tokens past the break copies from there rather than from the "
        "occurrence the index keeps (the latest), unless the index's shares a longer history with the present: "
        "quoted code with a typo fixed goes on after the fix, while the same short n-gram's latest occurrence is "
        "often elsewhere. 0: never",
    )
    repeat_runs: bool = Field(
        default=True,
        description="a copy that reaches the context's end goes on repeating the copied run (periodic text) "
        "instead of stopping there",
    )
    depth_edges: tuple[int, ...] = Field(
        default=(4, 6, 8, 12, 16, 24, 32, 48, 64),
        description="copy-depth bin edges: one acceptance estimate per bin of how many tokens the context shares "
        "with the copied occurrence when a draft token is due (see CopyDepthEstimate). () = one estimate for "
        "every draft token (the paper)",
    )
    depth_memory: float = Field(
        default=50.0, ge=1.0,
        description="tokens of evidence each copy-depth bin remembers: older observations fade by 1 - 1/memory "
        "per new one, so the estimates follow a change of task",
    )

    _longest_first = field_validator("ngram_sizes")(staticmethod(longest_first))
    _ladder = field_validator("depth_prior", "short_prior")(staticmethod(probability_ladder))

    @field_validator("short_sizes")
    @classmethod
    def _short_longest_first(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        return longest_first(sizes) if sizes else ()

    _increasing = field_validator("depth_edges")(staticmethod(increasing_edges))

    @property
    def shorter_sizes(self) -> tuple[int, ...]:
        """The short lengths in use: those below ngram_sizes' shortest."""
        return tuple(n for n in self.short_sizes if n < self.ngram_sizes[-1])


class NgramIndex:
    """For each n-gram length, where the continuation of every n-gram seen so far starts.

    ``starts[n][ngram] = c`` means ``tokens[c - n:c] == ngram`` and the continuation to copy is
    ``tokens[c:]``. Only continuation starts up to ``len(tokens) - 1`` are indexed, so the current
    suffix never matches itself and every match has at least one token to copy. With
    ``keep="recent"`` a later occurrence overwrites the entry, with ``keep="first"`` the first one
    stays.
    """

    def __init__(self, sizes: tuple[int, ...], keep: Literal["recent", "first"]) -> None:
        self.sizes = sizes
        self.keep_first = keep == "first"
        self._longest = max(sizes)
        self.starts: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in sizes}
        self.indexed = 0  # continuation starts below this are in the index
        self._seen = ContextFingerprint()  # the indexed context, to notice one that does not continue it

    def clear(self) -> None:
        for starts in self.starts.values():
            starts.clear()
        self.indexed = 0
        self._seen.clear()

    def catch_up(self, tokens: np.ndarray) -> None:
        """Index the n-grams whose continuation starts at a position not yet indexed."""
        if self.indexed and not self._seen.continued_by(tokens):
            self.clear()  # another context: the old index would draft from text that is not there
        first, last = self.indexed, tokens.shape[0] - 1  # new continuation starts: first..last
        if last < first:
            return
        offset = max(0, first - self._longest)
        window = tokens[offset:last].tolist()  # every token of every new n-gram, as Python ints
        for n, starts in self.starts.items():
            first_start = max(first, n)
            if first_start > last:
                continue
            tail = window[first_start - n - offset :]
            # the n-grams ending just before each start (zip stops at the shortest: intended)
            keys = zip(*(tail[i:] for i in range(n)), strict=False)
            positions = range(first_start, last + 1)
            if self.keep_first:
                for key, position in zip(keys, positions, strict=False):
                    starts.setdefault(key, position)
            else:
                starts.update(zip(keys, positions, strict=False))  # later positions overwrite: most recent wins
        self.indexed = last + 1
        self._seen.record(tokens[: self.indexed])

    def matches(self, tokens: np.ndarray) -> list[tuple[int, int]]:
        """(n, continuation start) for every length whose final n-gram occurred earlier, longest first."""
        length = tokens.shape[0]
        suffix = tokens[max(0, length - self._longest) :].tolist()
        found = []
        for n in self.sizes:
            if n >= length:  # an earlier occurrence needs at least n + 1 tokens of context
                continue
            start = self.starts[n].get(tuple(suffix[len(suffix) - n :]))
            if start is not None:
                found.append((n, start))
        return found


def match_depth(tokens: np.ndarray, start: int, cap: int) -> int:
    """How many tokens just before ``start`` equal the context's last tokens, counting at most ``cap``.

    ``start`` is a continuation start, so the matched n-gram guarantees at least n. A copy in
    progress (a function quoted back, a list re-typed) shares far more history with its source,
    and the longer the shared history, the likelier the copy goes on.
    """
    span = min(cap, start)
    earlier = tokens[start - span : start][::-1]
    recent = tokens[tokens.shape[0] - span :][::-1]
    differ = np.flatnonzero(earlier != recent)
    return int(differ[0]) if differ.size else span


def ngram_starts(tokens: np.ndarray, n: int, first: int, last: int) -> np.ndarray:
    """Continuation starts ``c`` in ``first..last`` whose n tokens before equal the context's last n, ascending."""
    first = max(first, n)
    if n >= tokens.shape[0] or last < first:
        return np.empty(0, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(tokens[first - n : last], n)  # the n-grams ending at each start
    return np.flatnonzero((windows == tokens[-n:]).all(axis=1)) + first


class ContextMatchSource:
    """Prompt-lookup drafts from an incremental n-gram index; one instance per decoder.

    Design decisions:

    * **Longest match first.** The longest of ``ngram_sizes`` whose final n-gram occurred earlier
      drafts: a longer shared history makes the copied future likelier to be right.
    * **EOS.** A draft stops *before* the first EOS token of the copied text. Drafting the EOS
      itself can never raise the yield: when every token before it is accepted, the target's
      bonus token is that same EOS for free; the EOS node would only cost a verification row.
      And text after an EOS (the next chat turn) is not a continuation of this one. A
      continuation that starts with EOS counts as no match for that length.
    * **Following a copy.** The index keeps one occurrence per n-gram, so where the last n-gram
      occurs twice with different continuations (the two example lines of a quoted docstring) it
      points at one of them whatever was being copied. When every token since the last draft
      followed that draft's occurrence, that occurrence is still a candidate: it continues from
      where the accepted tokens left it, and it wins when it shares a longer history with the
      present (:func:`match_depth`) than the index's choice. The paper's code gets the same effect
      by growing one confident chain to 100 tokens in a single cycle.
    * **Resuming after an edit.** A quoted class or function often comes back with one small
      change (two newlines where the prompt had three) and then goes on verbatim. When a copy that
      held for ``resume_copy`` tokens breaks on the target's own token and the index has nothing
      (no n-gram ends in the new token), the copy resumes where the written text ends in the
      occurrence, instead of a pass without a copy until the index finds it again.
    * **Rejoining after a longer edit.** An edit of several tokens (a misspelt name quoted back
      spelt right) leaves the index nothing until a short n-gram after the edit matches, and the
      index keeps that n-gram's latest occurrence, often somewhere else in the prompt. For
      ``rejoin_copy`` tokens after a held copy breaks, an occurrence of the matched n-gram within
      ``rejoin_copy`` tokens past the break in the copied text wins over the index's unless the
      index's shares a longer history with the present: near a break, locality is the better
      prior than recency.
    * **Short matches.** A quoted function's first line follows the output's own ```` ```python ````
      fence, which the prompt lacks, so ``def`` and its name match only as a 1-gram, and every pass
      until a 3-gram forms yields one token. So in the answer's first ``short_window`` tokens, when
      nothing else drafts, ``short_sizes`` (2- and 1-grams) are tried, and the longest that matches
      drafts if it occurred exactly once: one occurrence points at the one thing being quoted, many
      at chance. Anywhere else short matches cost more than they yield: in prose nearly every cycle
      has one, and its spine takes the budget the transition tree would use. Short drafts keep their
      own copy-depth estimate (starting at ``short_prior``), so they do not move the trust of
      fresh 3-gram matches.
    * **Consensus.** Each matched length copies from its own occurrence. ``Draft.consensus`` is
      the longest run of leading draft tokens that the continuation of at least one *other*
      occurrence (another length's) reproduces: two places in the text agreeing on what comes next
      (0 when only one occurrence matched). A shorter length that points at the very same
      occurrence is no second opinion: counted as agreement, a single earlier occurrence made most
      long copies look agreed and sent them down the linear bypass, without branches, at half the
      acceptance of true agreement.
    * **Scores.** Every token gets its copy-depth estimate (below): the conditional per-token
      acceptance that tree planners expect. Consensus tokens get ``max(estimate,
      consensus_score)`` because agreeing matches are the paper's signal of a reliable copy.
    * **Estimates by copy depth.** One EMA for every match averages two regimes: a fresh 3-gram
      hit that may be chance, and a copy already dozens of tokens long. Under one estimate (~0.85
      per token) a 20-token draft is fully accepted with probability 0.85^20 = 4%; measured, a
      third of the drafts are, so the budget planner kept spines short and lost tokens in exactly
      the cycles that yield most. The source therefore estimates acceptance per bin of copy depth
      (:class:`CopyDepthEstimate`) and reports this draft's estimates token by token
      (``Draft.depth_acceptance``, which the budget planner sizes the spine by). The decoder's
      shared estimate (an EMA over every draft) ranks the source when it reports nothing, and is
      the whole estimate with ``depth_edges=()`` (the paper). Both are kept across requests: they
      describe how well the model's output repeats its context on this kind of task, not one
      prompt. The index is per request.
    """

    name = NAME

    def __init__(self, config: GooseConfig) -> None:
        self.options = ContextMatchOptions.model_validate(config.options_for(NAME))
        self.index = NgramIndex(self.options.ngram_sizes, self.options.occurrence)
        self.by_depth = CopyDepthEstimate(self.options.depth_edges, self.options.depth_prior,
                                          self.options.depth_memory) if self.options.depth_edges else None
        # short matches need per-copy estimates of their own; with depth_edges=() (the paper) none are tried
        self.short_by_depth = CopyDepthEstimate(self.options.depth_edges, self.options.short_prior,
                                                self.options.depth_memory) if self.by_depth is not None else None
        self._estimate = self.by_depth  # the estimate of the last draft's kind (long or short match)
        self._first_depth = 0  # copy depth of this cycle's first draft token; 0: nothing drafted
        # the occurrence the last draft copied: its continuation start and the context length then (-1: none)
        self._copy_start, self._copy_context = -1, -1
        # where the last held copy broke: the occurrence's token not kept, and the context length there (-1: none)
        self._broke_at, self._broke_context = -1, -1
        # statistics of the latest proposal, for benchmarks and debugging
        self.last_match_length = 0  # n of the n-gram that drafted; 0 = no match
        self.last_match_depth = 0
        self.last_consensus = 0
        self.proposals = 0
        self.matched = 0

    # --- hooks --------------------------------------------------------------------------------

    @goose.hookimpl
    def goose_reset(self) -> None:
        self.index.clear()
        self.last_match_length = self.last_match_depth = self.last_consensus = 0
        self._first_depth = 0
        self._copy_start = self._copy_context = -1
        self._broke_at = self._broke_context = -1

    @goose.hookimpl
    def goose_prefill(self, context: DecodeContext) -> None:
        self.index.clear()  # the prompt starts a new context even if goose_reset was not called
        self.index.catch_up(context.tokens)
        self._copy_start = self._copy_context = -1
        self._broke_at = self._broke_context = -1

    @goose.hookimpl
    def goose_propose(self, context: DecodeContext, acceptance: float) -> Draft | None:
        tokens = context.tokens
        self.index.catch_up(tokens)
        self.proposals += 1
        matches = self.index.matches(tokens)
        # the longest match drafts; one whose continuation starts with EOS yields to the next length
        copies = (self._continuation(tokens, start, context.eos_token_ids) for _, start in matches)
        chosen, copy = next(((i, copy) for i, copy in enumerate(copies) if copy), (-1, []))
        followed = self._followed(tokens)
        if followed >= 0:
            self._broke_at = self._broke_context = -1
        else:
            self._note_break(tokens)
        if followed >= 0 and (chosen < 0 or self._deeper(tokens, followed, matches[chosen][1])):
            going_on = self._continuation(tokens, followed, context.eos_token_ids)
            if going_on:
                # the followed copy drafts; the index's matches stay as second opinions (consensus)
                matches = [(self.last_match_length, followed), *matches]  # the n that started this copy
                chosen, copy = 0, going_on
        elif chosen >= 0:
            rejoined = self._rejoined(tokens, matches[chosen][1])
            going_on = self._continuation(tokens, rejoined[1], context.eos_token_ids) if rejoined else []
            if going_on:
                matches = [rejoined, *matches]  # the index's matches stay as second opinions
                chosen, copy = 0, going_on
        if chosen < 0:
            resumed = self._resumed(tokens, context.tokenizer)
            going_on = self._continuation(tokens, resumed, context.eos_token_ids) if resumed >= 0 else []
            if going_on:
                matches, chosen, copy = [(self.last_match_length, resumed)], 0, going_on
        estimate = self.by_depth
        if chosen < 0:
            short = self._short(tokens, context.prompt_length)
            going_on = self._continuation(tokens, short[1], context.eos_token_ids) if short else []
            if going_on:  # a short match drafts alone: no second opinions, its own estimate
                matches, chosen, copy, estimate = [short], 0, going_on, self.short_by_depth
        if chosen < 0:
            self.last_match_length = self.last_match_depth = self.last_consensus = 0
            self._first_depth = 0
            self._copy_start = self._copy_context = -1
            return None
        length, start = matches[chosen]
        self._copy_start, self._copy_context = start, tokens.shape[0]
        self._estimate = estimate
        if estimate is not None:
            depth = match_depth(tokens, start, int(estimate.edges[-1]))
            estimates = estimate.profile(depth, len(copy))
            profile = without_trailing_repeats(estimates.tolist())
        else:  # the paper's single estimate: the shared one
            depth, estimates, profile = length, np.full(len(copy), acceptance), ()
        self._first_depth = max(depth, 1)  # a resumed copy shares no history with the present (0 is "none")
        consensus = 0
        # longer lengths than the chosen one copied nothing, so only shorter ones can agree; the
        # draft holds no EOS, so a common run ends before any EOS of the other continuation
        for _, other_start in matches[chosen + 1 :]:
            if other_start == start:  # the same occurrence seen through a shorter n-gram: no second opinion
                continue
            consensus = max(consensus, common_prefix(copy, self._copy(tokens, other_start, len(copy))))
            if consensus == len(copy):
                break
        scores = estimates.astype(np.float64)
        if consensus:
            scores[:consensus] = np.maximum(scores[:consensus], self.options.consensus_score)
        self.matched += 1
        self.last_match_length, self.last_match_depth, self.last_consensus = length, depth, consensus
        return Draft.chain(copy, scores, consensus=consensus, depth_acceptance=profile)

    @goose.hookimpl
    def goose_observe(self, outcome: VerifyOutcome, own_nodes: np.ndarray) -> None:
        if self._estimate is not None and self._first_depth:
            self._estimate.observe_draft(self._first_depth, outcome, own_nodes)

    # --- helpers ------------------------------------------------------------------------------

    def _followed(self, tokens: np.ndarray) -> int:
        """Where the last draft's occurrence continues now, if every token since followed it; else -1."""
        if not self.options.follow_copy or self._copy_start < 0:
            return -1
        added = tokens.shape[0] - self._copy_context
        start = self._copy_start + added
        if added <= 0 or start >= tokens.shape[0]:
            return -1
        copied = self._copy(tokens[: self._copy_context], self._copy_start, added)
        return start if np.array_equal(copied, tokens[self._copy_context :]) else -1

    def _short(self, tokens: np.ndarray, prompt_length: int) -> tuple[int, int] | None:
        """(n, continuation start) of the longest short length that matches, if the answer is in its opening
        and that n-gram occurred once; else None. A scan, not the index: it runs only in the opening."""
        if self.short_by_depth is None or tokens.shape[0] - prompt_length >= self.options.short_window:
            return None
        for n in self.options.shorter_sizes:
            starts = ngram_starts(tokens, n, n, tokens.shape[0] - 1)
            if starts.size:
                return (n, int(starts[0])) if starts.size == 1 else None
        return None

    def _note_break(self, tokens: np.ndarray) -> None:
        """Remember where the last draft's copy broke, if it had held for ``resume_copy`` tokens there."""
        if not self.options.rejoin_copy or self._copy_start < 0:
            return
        added = tokens.shape[0] - self._copy_context
        if added <= 0:
            return
        kept = common_prefix(self._copy(tokens[: self._copy_context], self._copy_start, added),
                             tokens[self._copy_context :])
        broke = self._copy_start + kept  # the occurrence's token the target did not keep
        if kept >= added or broke >= self._copy_context:  # no break, or one inside a repeated run
            return
        held = self.options.resume_copy
        if match_depth(tokens[: self._copy_context + kept], broke, held) >= held:
            self._broke_at, self._broke_context = broke, self._copy_context + kept

    def _rejoined(self, tokens: np.ndarray, found: int) -> tuple[int, int] | None:
        """(n, continuation start) of the final n-gram's occurrence nearest past where the copy broke.

        Only within ``rejoin_copy`` tokens of the break on both sides (written since, and past the
        break in the occurrence), and only when it shares at least as long a history with the
        present as the index's occurrence ``found``; else None.
        """
        if self._broke_at < 0:
            return None
        window = self.options.rejoin_copy
        since = tokens.shape[0] - self._broke_context  # tokens written since the break, its own included
        if since > window:
            self._broke_at = self._broke_context = -1
            return None
        expected = self._broke_at + since  # where the occurrence would be had nothing been inserted or dropped
        first, last = self._broke_at + 1, min(expected + window, tokens.shape[0] - 1)  # continuation starts searched
        for n in self.options.ngram_sizes:
            hits = ngram_starts(tokens, n, first, last)
            if hits.size:
                start = int(hits[np.argmin(np.abs(hits - expected))])  # the nearest; ties: the earlier
                if start == found:
                    return None
                cap = tokens.shape[0]
                return (n, start) if match_depth(tokens, start, cap) >= match_depth(tokens, found, cap) else None
        return None

    def _resumed(self, tokens: np.ndarray, tokenizer: Any) -> int:
        """Where the last draft's occurrence resumes after the target replaced its last token; else -1.

        Every token since the last draft followed its occurrence except the newest, the target's own
        token where the copy broke. When that token is the occurrence's next one the target skipped a
        token: resume after it. Otherwise it wrote other text in place of one or more of the
        occurrence's tokens (two newlines for three; one token for a closing quote and the two
        tokens of newlines after it): resume after the run of the occurrence's tokens whose text is
        nearest in length to the written token's (after one token without a tokenizer). Only a copy
        that held for at least ``resume_copy`` tokens is resumed.
        """
        if not self.options.resume_copy or self._copy_start < 0:
            return -1
        added = tokens.shape[0] - self._copy_context
        if added <= 0:
            return -1
        broke = self._copy_start + added - 1  # the occurrence's token the target did not keep
        if broke + 2 >= self._copy_context:  # resuming needs the occurrence's next tokens in the context then
            return -1
        written = int(tokens[-1])
        if tokens[broke] == written or not np.array_equal(tokens[self._copy_start : broke],
                                                           tokens[self._copy_context : -1]):
            return -1
        held = self.options.resume_copy
        if match_depth(tokens[:-1], broke, held) < held:
            return -1
        if tokens[broke + 1] == written:
            return broke + 2
        spelled = getattr(tokenizer, "convert_ids_to_tokens", None)
        if spelled is None:
            return broke + 1
        replaced = tokens[broke : min(broke + 3, self._copy_context - 1)].tolist()
        widths = np.cumsum([len(text or "") for text in spelled(replaced)])
        return broke + 1 + int(np.argmin(np.abs(widths - len(spelled([written])[0] or ""))))

    def _deeper(self, tokens: np.ndarray, followed: int, found: int) -> bool:
        """Whether the followed occurrence shares a longer history with the present than the index's."""
        if followed == found:
            return False
        cap = tokens.shape[0]
        return match_depth(tokens, followed, cap) > match_depth(tokens, found, cap)

    def _continuation(self, tokens: np.ndarray, start: int, eos: frozenset[int]) -> list[int]:
        """Up to max_continuation tokens copied from ``start``, ending before the first EOS."""
        return list(before_eos(self._copy(tokens, start, self.options.max_continuation).tolist(), eos))

    def _copy(self, tokens: np.ndarray, start: int, count: int) -> np.ndarray:
        """``count`` tokens from ``start``; a copy that reaches the context's end repeats ``tokens[start:]``.

        The occurrence then overlaps the present: the text is a run with period ``len - start``
        (a loop, a table row, a list pattern), and the rule that drafted ``tokens[start:]``
        drafts the same tokens again once they are accepted, so they are drafted in one go.
        """
        if start + count <= tokens.shape[0] or not self.options.repeat_runs:
            return tokens[start : start + count]
        return np.resize(tokens[start:], count)  # np.resize repeats its input cyclically


@goose.hookimpl
def goose_register_sources(register: Register) -> None:
    register(NAME, ContextMatchSource, description="prompt lookup: copy what followed the last n-gram earlier",
             initial_acceptance=0.5)
