"""The built-in candidate sources, on plain token arrays: both are model-agnostic.

Context match is checked against a brute-force numpy search over many random contexts grown
token by token; the bigram transition table against a plain-Python model of the same rules.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from goose import DecodeContext, GooseConfig, Harvest
from goose.boundary import SourceSet
from goose.plugins import BUILTIN_ORIGIN, registry
from goose.sources.bigram_transition import (
    EMPTY,
    BigramTransitionSource,
    SuccessorTable,
    bigram_bucket,
)
from goose.sources.context_match import ContextMatchOptions, ContextMatchSource, match_depth
from goose.sources.toolkit import CopyDepthEstimate
from tests.helpers import make_outcome, own

EOS = 999  # outside the small ids the tests draw with


def make_config(**source_options: dict) -> GooseConfig:
    return GooseConfig(source_options=source_options)


def make_context(tokens: list[int] | np.ndarray, vocab_size: int = 1000,
                 eos: tuple[int, ...] = (EOS,), tokenizer: object = None) -> DecodeContext:
    array = np.asarray(tokens, dtype=np.int64)
    return DecodeContext(tokens=array, prompt_length=array.shape[0], vocab_size=vocab_size,
                         eos_token_ids=frozenset(eos), tokenizer=tokenizer)


CAP = ContextMatchOptions().max_continuation  # the default cap of one draft


def looped(run: list[int], count: int = CAP) -> list[int]:
    """What context match drafts when its copy reaches the context's end: the run, repeated (to the default cap)."""
    return np.resize(np.asarray(run), count).tolist()


def propose(source: ContextMatchSource, tokens: list[int], acceptance: float = 0.5,
            **context_args) -> list[int] | None:
    draft = source.goose_propose(make_context(tokens, **context_args), acceptance)
    return None if draft is None else draft.tokens.tolist()


# --- registration -------------------------------------------------------------------------------


def test_both_sources_are_registered_as_built_ins() -> None:
    known = registry()
    for name, cls in (("context_match", ContextMatchSource), ("bigram_transition", BigramTransitionSource)):
        registration = known.source(name)
        assert registration.origin == BUILTIN_ORIGIN
        assert registration.factory is cls
        assert registration.description
        assert isinstance(registration.factory(GooseConfig()), cls)


def test_hooks_run_through_the_plugin_boundary(caplog: pytest.LogCaptureFixture) -> None:
    """pluggy passes hook arguments by name: a misspelt argument would surface here as a skipped source."""
    flat_prior = GooseConfig(source_options={"context_match": {"depth_prior": 0.5}})
    sources = SourceSet(["context_match", "bigram_transition"], flat_prior, vocab_size=1000)
    context = make_context([1, 2, 3, 40, 41, 1, 2, 3])
    sources.reset()
    sources.prefill(context, harvest_of([2], [3], [list(range(100, 110))]))
    pool, auxiliary = sources.propose(context)
    assert auxiliary == []
    assert [c.name for c in pool.drafting] == ["context_match"]  # the transition source branches, it does not draft
    draft = pool.drafting[0].draft
    assert draft.tokens.tolist() == looped([40, 41, 1, 2, 3]) and draft.scores is not None
    # every copy-depth bin is still at its prior: one estimate for the whole draft, which ranks the source
    assert pool.drafting[0].acceptance == 0.5 and pool.drafting[0].depth_acceptance == ()
    assert [c.name for c in pool.branching] == ["bigram_transition"] and pool.branching[0].acceptance == 0.05
    found, scores = pool.branching[0].successors(np.array([2]), np.array([3]), 4)
    assert found.tolist() == [[100, 101, 102, 103]] and scores.shape == (1, 4)
    outcome = make_outcome(sources.names, {"context_match": [40, 41], "bigram_transition": [100]},
                           {"context_match": 2})
    assert sources.observe(outcome, {}) == {"context_match": (2, 2), "bigram_transition": (1, 0)}
    assert sources.estimates["context_match"].rate == pytest.approx(0.5 + 0.3 * (1.0 - 0.5))
    assert sources.estimates["bigram_transition"].rate == pytest.approx(0.05 * 0.7)
    assert "skipped" not in caplog.text


# --- context match: behaviour -------------------------------------------------------------------


def test_longest_ngram_wins_over_a_more_recent_shorter_one() -> None:
    # [1..5] occurred first, followed by 10 11 12; only [3 4 5] occurred later, followed by 20 21
    tokens = [1, 3, 4, 5, 10, 11, 12, 9, 3, 4, 5, 20, 21, 9, 1, 3, 4, 5]
    source = ContextMatchSource(GooseConfig())
    assert propose(source, tokens) == looped([10, 11, 12, 9, 3, 4, 5, 20, 21, 9, 1, 3, 4, 5])
    assert source.last_match_length == 4


def test_most_recent_occurrence_by_default_and_first_on_request() -> None:
    tokens = [7, 8, 9, 100, 101, 51, 7, 8, 9, 200, 201, 52, 7, 8, 9]
    assert propose(ContextMatchSource(GooseConfig()), tokens)[:2] == [200, 201]
    first = ContextMatchSource(make_config(context_match={"occurrence": "first"}))
    assert propose(first, tokens)[:2] == [100, 101]


def test_a_copy_in_progress_is_followed_past_an_ambiguous_ngram() -> None:
    # a quoted passage whose 5-gram [1 2 3 4 5] occurs twice, followed by 50.. the first time, 60.. the second
    passage = [90, 91, 92, 93, 94, 1, 2, 3, 4, 5, 50, 51, 52, 53, 1, 2, 3, 4, 5, 60, 61, 62, 63, 7, 8, 9]
    opening = [*passage, 0, 90, 91, 92, 93, 94]  # the output starts quoting it
    quoted = [1, 2, 3, 4, 5, 50, 51, 52, 53, 1, 2, 3, 4, 5]  # then every drafted token is accepted
    for follow, expected in ((True, [60, 61, 62, 63]), (False, [50, 51, 52, 53])):
        source = ContextMatchSource(make_config(context_match={"follow_copy": follow}))
        assert propose(source, opening)[:len(quoted)] == quoted
        # the index's latest [1 2 3 4 5] is the output's own first quote (-> 50..); the copy goes on to 60..
        assert propose(source, opening + quoted)[:4] == expected
    # a token that left the copy: no longer followed; the index's latest occurrence again (the output's own)
    source = ContextMatchSource(GooseConfig())
    propose(source, opening)
    assert propose(source, [*opening, 1, 2, 3, 4, 5, 50, 51, 52, 54, 1, 2, 3, 4, 5])[:4] == [50, 51, 52, 54]

def test_continuation_is_capped() -> None:
    tokens = [1, 2, 3, *range(100, 220), 1, 2, 3]
    assert propose(ContextMatchSource(GooseConfig()), tokens) == list(range(100, 100 + CAP))  # the default cap
    short = ContextMatchSource(make_config(context_match={"max_continuation": 5}))
    assert propose(short, tokens) == list(range(100, 105))


def test_a_copy_reaching_the_context_end_repeats_the_run() -> None:
    # the latest earlier occurrence of [7]*5 ends one token before the end: the run is [7]
    assert propose(ContextMatchSource(GooseConfig()), [7] * 10) == [7] * CAP
    days = [1, 2, 3, 4, 5, 6, 7] * 3
    assert propose(ContextMatchSource(GooseConfig()), days) == ([1, 2, 3, 4, 5, 6, 7] * 15)[:CAP]
    # repeat_runs=False: the copy stops at the context's end
    plain = ContextMatchSource(make_config(context_match={"repeat_runs": False}))
    assert propose(plain, [7] * 10) == [7]
    assert propose(plain, days) == [1, 2, 3, 4, 5, 6, 7]
    # too short for any earlier 3-gram: nothing
    assert propose(ContextMatchSource(GooseConfig()), [7, 7, 7]) is None


def test_draft_stops_before_eos() -> None:
    tokens = [1, 2, 3, 40, 41, EOS, 60, 61, 9, 1, 2, 3]
    source = ContextMatchSource(GooseConfig())
    assert propose(source, tokens) == [40, 41]
    # every id in eos_token_ids counts
    assert propose(ContextMatchSource(GooseConfig()), tokens, eos=(41,)) == [40]


def test_continuation_starting_with_eos_yields_to_a_shorter_match() -> None:
    # the 5-gram's continuation is EOS; [3 4 5] also occurred before 70 71
    tokens = [1, 2, 3, 4, 5, EOS, 8, 3, 4, 5, 70, 71, 9, 1, 2, 3, 4, 5]
    source = ContextMatchSource(GooseConfig())
    assert propose(source, tokens) == looped([70, 71, 9, 1, 2, 3, 4, 5])
    assert source.last_match_length == 3
    # nothing but EOS to copy: no draft
    assert propose(ContextMatchSource(GooseConfig()), [1, 2, 3, EOS, 1, 2, 3]) is None


def test_no_match_gives_no_draft() -> None:
    source = ContextMatchSource(GooseConfig())
    assert propose(source, list(range(50))) is None
    assert source.last_match_length == 0


def test_consensus_counts_leading_tokens_that_two_occurrences_agree_on() -> None:
    config = GooseConfig()
    # one occurrence serves all three lengths: the shorter ones are no second opinion
    same = [1, 2, 3, 4, 5, 60, 61, 62, 9, 1, 2, 3, 4, 5]
    source = ContextMatchSource(config)
    draft = source.goose_propose(make_context(same), 0.5)
    assert len(draft) == CAP and draft.consensus == 0  # the run of 9, repeated
    # a later [2 3 4 5] continues 60 61 then diverges: the 5-gram and the shorter ones agree on 2 tokens
    split = [1, 2, 3, 4, 5, 60, 61, 62, 9, 2, 3, 4, 5, 60, 61, 99, 8, 1, 2, 3, 4, 5]
    draft = source.goose_propose(make_context(split), 0.5)
    assert draft.tokens.tolist()[:3] == [60, 61, 62]
    assert draft.consensus == 2 and source.last_consensus == 2
    # only the 3-gram matches: no second opinion
    lone = [3, 4, 5, 60, 61, 8, 9, 3, 4, 5]
    assert source.goose_propose(make_context(lone), 0.5).consensus == 0


def test_scores_are_the_acceptance_estimate_boosted_on_consensus() -> None:
    source = ContextMatchSource(make_config(context_match={"depth_prior": 0.3, "consensus_score": 0.8}))
    split = [1, 2, 3, 4, 5, 60, 61, 62, 9, 2, 3, 4, 5, 60, 61, 99, 8, 1, 2, 3, 4, 5]
    draft = source.goose_propose(make_context(split), 0.5)
    assert (draft.parents == np.arange(-1, len(draft) - 1)).all() and draft.consensus == 2
    assert draft.scores[:2].tolist() == pytest.approx([0.8, 0.8])
    assert draft.scores[2:].tolist() == pytest.approx([0.3] * (len(draft) - 2))
    # a source already trusted beyond the consensus floor keeps its own estimate
    source.by_depth.rates[:] = 0.95
    assert source.goose_propose(make_context(split), 0.5).scores.tolist() == pytest.approx([0.95] * len(draft))


def test_custom_ngram_sizes_are_sorted_longest_first() -> None:
    source = ContextMatchSource(make_config(context_match={"ngram_sizes": [1, 2]}))
    assert source.options.ngram_sizes == (2, 1)
    assert propose(source, [5, 6, 8, 9, 6]) == looped([8, 9, 6])
    assert source.last_match_length == 1


@pytest.mark.parametrize("options", [{"ngram_sizes": []}, {"ngram_sizes": [0, 3]}, {"max_continuation": 0},
                                     {"occurrence": "latest"}, {"no_such_option": 1}, {"depth_edges": [16, 8]},
                                     {"depth_edges": [0, 8]}, {"depth_memory": 0.5}])
def test_bad_options_are_refused(options: dict) -> None:
    with pytest.raises(ValidationError):
        ContextMatchSource(make_config(context_match=options))


def test_reset_forgets_the_previous_request() -> None:
    source = ContextMatchSource(GooseConfig())
    first_request = [1, 2, 3, 40, 41, 1, 2, 3]
    assert propose(source, first_request) == looped([40, 41, 1, 2, 3])
    source.goose_reset()
    assert source.index.indexed == 0 and all(not starts for starts in source.index.starts.values())
    # a new prompt that ends like the old one has nothing to copy from
    assert propose(source, [9, 9, 1, 2, 3]) is None


def test_a_new_context_is_detected_without_reset() -> None:
    source = ContextMatchSource(GooseConfig())
    assert propose(source, [1, 2, 3, 40, 41, 1, 2, 3]) == looped([40, 41, 1, 2, 3])
    # same length, different text: the stale index must not be used
    assert propose(source, [1, 2, 3, 50, 51, 1, 2, 3]) == looped([50, 51, 1, 2, 3])
    # shorter
    assert propose(source, [1, 2, 3, 9, 1, 2, 3]) == looped([9, 1, 2, 3])
    # longer, but not an extension
    assert propose(source, [8, 8, 1, 2, 3, 60, 1, 2, 3]) == looped([60, 1, 2, 3])


def test_prefill_indexes_the_prompt_and_propose_catches_up() -> None:
    source = ContextMatchSource(GooseConfig())
    prompt = [1, 2, 3, 40, 41, 42, 5]
    source.goose_prefill(make_context(prompt))
    assert source.index.indexed == len(prompt)
    assert propose(source, [*prompt, 1, 2, 3]) == looped([40, 41, 42, 5, 1, 2, 3])


def test_the_shared_estimate_follows_each_sources_own_nodes() -> None:
    """The boundary keeps one estimate per registered name and moves it by its own nodes' fate only."""
    config = GooseConfig(initial_acceptance={"context_match": 0.5})
    sources = SourceSet(["context_match", "bigram_transition"], config, vocab_size=1000)
    names = sources.names
    # 3 of context match's nodes accepted, the 4th reached and rejected: 3/4; the bigram nodes do not count
    outcome = make_outcome(names, {"context_match": [10, 11, 12, 13, 14], "bigram_transition": [20, 21]},
                           {"context_match": 3, "bigram_transition": 0})
    sources.observe(outcome, {})
    assert sources.estimates["context_match"].rate == pytest.approx(0.7 * 0.5 + 0.3 * 0.75)
    assert sources.estimates["bigram_transition"].rate == pytest.approx(0.7 * 0.05)
    # none of context match's nodes reached: no update
    before = sources.estimates["context_match"].rate
    sources.observe(make_outcome(names, {"bigram_transition": [20]}, {"bigram_transition": 1}), {})
    assert sources.estimates["context_match"].rate == before
    # the estimate survives a reset: it describes model and task, not one prompt
    sources.reset()
    assert sources.estimates["context_match"].rate == before


def test_match_depth_counts_the_history_shared_with_the_copied_occurrence() -> None:
    #          0  1  2  3  4  5  6  7  8  9 10 11 12 13 14
    tokens = np.array([7, 1, 2, 3, 4, 5, 60, 61, 8, 2, 3, 4, 5], dtype=np.int64)
    # the continuation of [2 3 4 5] starts at 6; tokens before 6 and before the end agree for 4 tokens
    assert match_depth(tokens, 6, cap=64) == 4
    assert match_depth(tokens, 6, cap=3) == 3
    # a copy running since the very start: the whole history before the start agrees
    copy = np.array([1, 2, 3, 4, 9, 1, 2, 3, 4], dtype=np.int64)
    assert match_depth(copy, 4, cap=64) == 4
    # periodic text: the shared history overlaps the suffix itself
    periodic = np.array([5, 6] * 10, dtype=np.int64)
    assert match_depth(periodic, 2, cap=64) == 2
    assert match_depth(periodic, 18, cap=64) == 18


@given(st.lists(st.integers(0, 3), min_size=2, max_size=40), st.data())
@settings(max_examples=200, deadline=None)
def test_match_depth_matches_a_plain_loop(values: list[int], data: st.DataObject) -> None:
    tokens = np.array(values, dtype=np.int64)
    start = data.draw(st.integers(1, len(values) - 1))
    cap = data.draw(st.integers(1, 50))
    expected = 0
    while expected < cap and start - 1 - expected >= 0 and tokens[start - 1 - expected] == tokens[-1 - expected]:
        expected += 1
    assert match_depth(tokens, start, cap) == expected


def test_acceptance_is_estimated_per_copy_depth() -> None:
    # scores = the estimates; a memory long enough that nothing fades within the test
    options = {"depth_prior": 0.5, "depth_edges": [8], "consensus_score": 0.0, "depth_memory": 1e6}
    source = ContextMatchSource(make_config(context_match=options))
    names = ("context_match",)
    shallow = [1, 2, 3, 40, 41, 42, 43, 44, 9, 9, 1, 2, 3]  # a fresh 3-gram match: depth 3
    deep = [*range(100, 112), 50, 51, *range(100, 112)]  # a 12-token copy (depth counted to the last edge)
    draft = source.goose_propose(make_context(shallow), 0.5)
    assert draft.tokens.tolist() == looped([40, 41, 42, 43, 44, 9, 9, 1, 2, 3])
    assert source.last_match_depth == 3 and draft.depth_acceptance == (0.5,)
    # the shallow draft fails at its first token (copy depth 3): only the < 8 bin learns it,
    # (0 accepted + 2 prior pseudo-tokens * 0.5) / (1 tested + 2)
    outcome = make_outcome(names, {"context_match": [40, 41]}, {"context_match": 0})
    source.goose_observe(outcome, own(outcome, "context_match"))
    assert source.by_depth.rates.tolist() == pytest.approx([1 / 3, 0.5])
    # the same draft again: its first five tokens are due at depths 3..7, the rest at 8 and beyond
    draft = source.goose_propose(make_context(shallow), 0.5)
    assert draft.depth_acceptance == pytest.approx((1 / 3,) * 5 + (0.5,))
    assert draft.scores.tolist() == pytest.approx([1 / 3] * 5 + [0.5] * (len(draft) - 5))
    # a deep match is estimated by the deep bin alone
    draft = source.goose_propose(make_context(deep), 0.5)
    assert source.last_match_depth == 8 and draft.depth_acceptance == (0.5,)
    outcome = make_outcome(names, {"context_match": [50, 51, 100]}, {"context_match": 3})
    source.goose_observe(outcome, own(outcome, "context_match"))
    assert source.by_depth.rates.tolist() == pytest.approx([1 / 3, (3 + 1) / (3 + 2)])
    # nodes of another source teach the copy-depth bins nothing
    outcome = make_outcome(("other", "context_match"), {"other": [50, 51, 100]}, {"other": 3})
    source.goose_propose(make_context(deep), 0.5)
    source.goose_observe(outcome, own(outcome, "context_match"))
    assert source.by_depth.rates.tolist() == pytest.approx([1 / 3, (3 + 1) / (3 + 2)])


def test_copy_depth_estimates_fade_old_evidence() -> None:
    estimate = CopyDepthEstimate((4,), prior=0.5, memory=10)
    estimate.observe(np.full(50, 5), np.zeros(50, dtype=bool))  # a long run of misses at depth 5
    assert estimate.rates[1] < 0.1 and estimate.rates[0] == 0.5
    estimate.observe(np.full(50, 5), np.ones(50, dtype=bool))  # then a long run of hits: the misses fade
    assert estimate.rates[1] > 0.85
    assert estimate.tested[1] < 10.5  # a bin weighs at most ~memory tokens of evidence


def test_without_depth_edges_one_estimate_covers_every_match() -> None:
    """The paper's single estimate: every draft token scored with the shared estimate, no per-depth report."""
    source = ContextMatchSource(make_config(context_match={"depth_edges": [], "consensus_score": 0.0}))
    draft = source.goose_propose(make_context([*range(100, 112), 50, 51, *range(100, 112)]), 0.65)
    assert source.by_depth is None and draft.depth_acceptance == ()
    assert draft.scores.tolist() == pytest.approx([0.65] * len(draft))


# --- context match: the incremental index against a brute-force search -------------------------


def brute_force(tokens: np.ndarray, sizes: tuple[int, ...], cap: int, occurrence: str,
                eos: frozenset[int]) -> tuple[list[int], int, int] | None:
    """(draft, matched n, consensus) by scanning every earlier position with numpy, or None."""
    length = tokens.shape[0]
    found = []  # (n, continuation, start) for every length with an earlier occurrence, longest first
    for n in sorted(sizes, reverse=True):
        if length < n + 1:
            continue
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)
        hits = np.flatnonzero((windows == tokens[length - n :]).all(axis=1))
        if hits.size:
            start = int(hits[-1] if occurrence == "recent" else hits[0]) + n
            continuation = np.resize(tokens[start:], cap).tolist() if start + cap > length else \
                tokens[start : start + cap].tolist()  # a run reaching the end repeats
            stops = [i for i, token in enumerate(continuation) if token in eos]
            found.append((n, continuation[: stops[0]] if stops else continuation, start))
    chosen = next((i for i, (_, copy, _) in enumerate(found) if copy), None)
    if chosen is None:
        return None
    n, copy, chosen_start = found[chosen]
    agreements = [0]
    for i, (_, other, start) in enumerate(found):
        if i != chosen and start != chosen_start:  # the same occurrence is no second opinion
            common = 0
            while common < min(len(copy), len(other)) and copy[common] == other[common]:
                common += 1
            agreements.append(common)
    return copy, n, max(agreements)


def random_text(rng: np.random.Generator, length: int, alphabet: int) -> np.ndarray:
    """Tokens from a small alphabet, often copying an earlier stretch, the way code and answers repeat:
    long matches, partial agreements between n-gram lengths and EOS hits all come up."""
    tokens: list[int] = []
    while len(tokens) < length:
        if tokens and rng.random() < 0.5:
            start = int(rng.integers(0, len(tokens)))
            tokens += tokens[start : start + int(rng.integers(1, 30))]
        else:
            tokens += rng.integers(0, alphabet, int(rng.integers(1, 8))).tolist()
    return np.asarray(tokens[:length], dtype=np.int64)


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    length=st.integers(1, 300),
    alphabet=st.integers(2, 8),
    prompt_share=st.floats(0.0, 1.0),
    sizes=st.sampled_from([(5, 4, 3), (3,), (4, 2), (6, 3, 1)]),
    cap=st.integers(1, 25),
    occurrence=st.sampled_from(["recent", "first"]),
    eos=st.sampled_from([frozenset(), frozenset({0}), frozenset({1, 3})]),
)
def test_incremental_index_equals_brute_force(seed: int, length: int, alphabet: int, prompt_share: float,
                                              sizes: tuple[int, ...], cap: int, occurrence: str,
                                              eos: frozenset[int]) -> None:
    rng = np.random.default_rng(seed)
    tokens = random_text(rng, length, alphabet)
    # the index alone (follow_copy off: the brute force knows no copy in progress)
    config = make_config(context_match={"ngram_sizes": sizes, "max_continuation": cap, "occurrence": occurrence,
                                        "follow_copy": False})
    source = ContextMatchSource(config)
    known = max(1, int(prompt_share * length))
    source.goose_prefill(make_context(tokens[:known], eos=tuple(eos)))
    while True:  # the context grows by a few accepted tokens a cycle, as in decoding
        context = tokens[:known]
        draft = source.goose_propose(make_context(context, eos=tuple(eos)), 0.5)
        expected = brute_force(context, sizes, cap, occurrence, eos)
        if expected is None:
            assert draft is None
        else:
            copy, n, consensus = expected
            assert draft is not None and draft.tokens.tolist() == copy
            assert source.last_match_length == n
            assert draft.consensus == consensus
        if known == length:
            break
        known = min(length, known + int(rng.integers(1, 8)))


def test_long_context_is_indexed_incrementally() -> None:
    """Each cycle indexes only the new tokens: the index size tracks the context length."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50_000, 3000)
    source = ContextMatchSource(GooseConfig())
    source.goose_prefill(make_context(tokens[:2000], vocab_size=50_000))
    for length in range(2001, 3000, 3):
        source.goose_propose(make_context(tokens[:length], vocab_size=50_000), 0.5)
        assert source.index.indexed == length
    assert len(source.index.starts[3]) <= 3000


# --- bigram transition ---------------------------------------------------------------------------

VOCAB = 500


def harvest_of(previous: list[int], tokens: list[int], top_tokens: list[list[int]],
               top_scores: list[list[float]] | None = None) -> Harvest:
    top = np.array(top_tokens, dtype=np.int64).reshape(len(tokens), -1)
    scores = (np.array(top_scores, dtype=np.float32) if top_scores is not None
              else np.tile(np.linspace(0.5, 0.05, top.shape[1], dtype=np.float32), (top.shape[0], 1)))
    return Harvest(previous=np.array(previous, dtype=np.int64), tokens=np.array(tokens, dtype=np.int64),
                   top_tokens=top, top_scores=scores)


def prefilled(options: dict | None = None, harvest: Harvest | None = None,
              vocab_size: int = VOCAB) -> BigramTransitionSource:
    source = BigramTransitionSource(make_config(bigram_transition=options or {}))
    source.goose_prefill(make_context([1, 2, 3], vocab_size=vocab_size), harvest or Harvest.empty(10))
    return source


def successors(source: BigramTransitionSource, previous: list[int], tokens: list[int],
               k: int = 10) -> tuple[list[list[int]], np.ndarray]:
    found, scores = source.goose_successors(np.array(previous, dtype=np.int64), np.array(tokens, dtype=np.int64), k)
    assert found.dtype == np.int64 and scores.dtype == np.float32
    assert found.shape == scores.shape == (len(tokens), min(k, source.options.top_k))
    return found.tolist(), scores


def test_harvested_top_k_comes_back_for_its_bigram() -> None:
    top = list(range(100, 110))
    source = prefilled(harvest=harvest_of([7], [8], [top], [[0.4, 0.2, 0.1, 0.1, 0.05, 0.05, 0.04, 0.03, 0.02, 0.01]]))
    found, scores = successors(source, [7], [8])
    assert found == [top]
    assert scores[0].tolist() == pytest.approx([0.4, 0.2, 0.1, 0.1, 0.05, 0.05, 0.04, 0.03, 0.02, 0.01], abs=1e-3)
    found, _ = successors(source, [7], [8], k=3)
    assert found == [top[:3]]
    assert source.bigram_hits == 2


def test_unknown_bigram_falls_back_to_the_unigram_row() -> None:
    source = prefilled(harvest=harvest_of([7, 9], [8, 8], [list(range(100, 110)), list(range(200, 210))]))
    # (9, 8) was written last: the unigram row of 8 holds its successors
    found, _ = successors(source, [7, 9, 3, -1], [8, 8, 8, 8])
    assert found[0] == list(range(100, 110))  # own bigram row
    assert found[1] == list(range(200, 210))  # own bigram row
    assert found[2] == list(range(200, 210))  # (3, 8) never seen: unigram row of 8
    assert found[3] == list(range(200, 210))  # previous unknown: unigram row of 8
    assert source.bigram_hits == 2


def test_nothing_known_reads_as_empty() -> None:
    source = prefilled(harvest=harvest_of([7], [8], [list(range(100, 110))]))
    found, scores = successors(source, [7, 1], [9, 2])
    assert found == [[EMPTY] * 10] * 2
    assert (scores == 0).all()


def test_bucket_collisions_read_as_misses() -> None:
    # one bucket for every pair: (7, 8) owns it, (6, 9) collides and must get 9's unigram row
    source = prefilled({"buckets": 1}, harvest_of([4, 7], [9, 8], [list(range(300, 310)), list(range(100, 110))]))
    found, _ = successors(source, [7, 6], [8, 9])
    assert found == [list(range(100, 110)), list(range(300, 310))]
    assert source.bigram_hits == 1


def test_bad_inputs_are_answered_not_raised() -> None:
    source = prefilled(harvest=harvest_of([-1, 7], [8, -3], [list(range(100, 110)), list(range(200, 210))]))
    # previous -1 wrote the unigram row only; token -3 wrote nothing
    assert (source.table.bigram_keys == EMPTY).all()
    found, scores = successors(source, [-1, 7, 7, -5, 7], [8, -3, VOCAB + 4, 8, 8])
    assert found[0] == list(range(100, 110))
    assert found[1] == found[2] == [EMPTY] * 10
    assert found[3] == found[4] == list(range(100, 110))
    assert (scores[1:3] == 0).all()
    # no nodes, a zero width
    assert successors(source, [], [])[0] == []
    assert source.goose_successors(np.array([7]), np.array([8]), 0) is None  # nothing to say at width 0


def test_successors_before_any_prefill_are_empty() -> None:
    source = BigramTransitionSource(GooseConfig())
    assert source.goose_successors(np.array([1, 2]), np.array([3, 4]), 10) is None
    source.goose_observe(make_outcome(("bigram_transition",), {"bigram_transition": [1]}, {}))  # no table: no-op


def test_harvest_is_fitted_to_the_table_width_and_vocabulary() -> None:
    source = prefilled({"top_k": 6}, harvest_of([7], [8], [[100, VOCAB + 1, 102]]))
    source.absorb(harvest_of([8], [9], [[1, 2, 3, 4, 5, 6, 7, 8]]))
    found, scores = successors(source, [7, 8], [8, 9])
    assert found[0] == [100, EMPTY, 102, EMPTY, EMPTY, EMPTY]  # padded; an id outside the vocabulary dropped
    assert scores[0, 1] == 0 and (scores[0, 3:] == 0).all()
    assert found[1] == [1, 2, 3, 4, 5, 6]  # cut to top_k
    assert source.goose_successors(np.array([7]), np.array([8]), 50)[0].shape == (1, 6)


def test_the_newest_row_wins_repeated_keys() -> None:
    harvest = harvest_of([7, 7, 7], [8, 8, 8], [[10] * 10, [11] * 10, [12] * 10])
    source = prefilled(harvest=harvest)
    assert successors(source, [7, 1], [8, 8])[0] == [[12] * 10, [12] * 10]


def test_reset_clears_unless_persistent() -> None:
    harvest = harvest_of([7], [8], [list(range(100, 110))])
    fresh = prefilled(harvest=harvest)
    fresh.goose_reset()
    assert successors(fresh, [7, 1], [8, 8])[0] == [[EMPTY] * 10] * 2
    assert (fresh.table.tokens == EMPTY).all() and (fresh.table.bigram_keys == EMPTY).all()
    kept = prefilled({"persist": True}, harvest)
    kept.goose_reset()
    assert successors(kept, [7, 1], [8, 8])[0] == [list(range(100, 110))] * 2
    # the next request's prefill adds to the persistent table rather than replacing it
    kept.goose_prefill(make_context([1, 2], vocab_size=VOCAB), harvest_of([1], [2], [list(range(300, 310))]))
    assert successors(kept, [7, 1], [8, 2])[0] == [list(range(100, 110)), list(range(300, 310))]


def test_reset_clears_everything_after_heavy_use() -> None:
    # more rows written than the reset bookkeeping follows: the whole table is cleared
    rng = np.random.default_rng(1)
    source = prefilled({"buckets": 64}, vocab_size=64)
    for _ in range(20):
        rows = rng.integers(0, 64, (2, 30))
        source.absorb(harvest_of(rows[0].tolist(), rows[1].tolist(), rng.integers(0, 64, (30, 10)).tolist()))
    source.goose_reset()
    assert (source.table.tokens == EMPTY).all() and (source.table.scores == 0).all()
    assert (source.table.bigram_keys == EMPTY).all()


def test_unigram_only_ablation_ignores_the_previous_token() -> None:
    harvest = harvest_of([7, 9], [8, 8], [list(range(100, 110)), list(range(200, 210))])
    source = prefilled({"unigram_only": True}, harvest)
    assert source.table.buckets == 0 and source.table.bigram_keys.size == 0
    assert successors(source, [7, 9], [8, 8])[0] == [list(range(200, 210))] * 2
    assert source.nbytes < prefilled().nbytes


def test_memory_stays_bounded_for_a_262k_vocabulary() -> None:
    vocab = 262_144
    source = prefilled(vocab_size=vocab, harvest=harvest_of([vocab - 1], [vocab - 2], [list(range(10))]))
    table = source.table
    assert table.unigram_tokens.shape == (vocab, 10) and table.unigram_tokens.dtype == np.int32
    assert table.bigram_tokens.shape == (2**18, 10) and table.bigram_keys.shape == (2**18,)
    assert table.scores.dtype == np.float16
    assert source.nbytes == (vocab + 2**18 + 1) * 10 * 6 + 2**18 * 8
    assert source.nbytes < 34 * 2**20
    assert successors(source, [vocab - 1], [vocab - 2])[0] == [list(range(10))]
    # the smaller vocabulary (SmolLM2) is mostly the bigram buckets
    assert prefilled(vocab_size=49_152).nbytes < 21 * 2**20


def test_vocabulary_size_is_checked() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        SuccessorTable(2**31, 16, 10)
    with pytest.raises(ValidationError):
        BigramTransitionSource(make_config(bigram_transition={"buckets": 0}))


def test_buckets_spread_keys_evenly() -> None:
    rng = np.random.default_rng(2)
    vocab, buckets = 262_144, 2**12
    keys = rng.integers(0, vocab, 100_000) * vocab + rng.integers(0, vocab, 100_000)
    counts = np.bincount(bigram_bucket(keys, buckets), minlength=buckets)
    assert counts.min() > 0 and counts.max() < 3 * counts.mean()
    # consecutive keys (one previous token, neighbouring tokens) spread as well
    assert np.unique(bigram_bucket(np.arange(1000, 2000, dtype=np.int64), buckets)).size > 700


def test_observe_harvests_every_verified_row() -> None:
    source = prefilled()
    names = ("context_match", "bigram_transition")
    harvest = harvest_of([7], [8], [list(range(100, 110))])
    outcome = make_outcome(names, {"context_match": [10, 11], "bigram_transition": [20, 21, 22]},
                           {"context_match": 2, "bigram_transition": 1}, harvest)
    source.goose_observe(outcome)
    assert successors(source, [7], [8])[0] == [list(range(100, 110))]


@settings(max_examples=60, deadline=None)
@given(
    harvests=st.lists(
        st.lists(st.tuples(st.integers(-1, 11), st.integers(0, 11), st.integers(0, 11)), min_size=0, max_size=12),
        min_size=1, max_size=6),
    buckets=st.sampled_from([1, 3, 16, 2**10]),
    unigram_only=st.booleans(),
)
def test_table_matches_a_plain_python_model(harvests: list[list[tuple[int, int, int]]], buckets: int,
                                            unigram_only: bool) -> None:
    """Rows (previous, token, first successor); the newest write wins each unigram row and each bucket."""
    vocab = 12
    source = prefilled({"buckets": buckets, "top_k": 2, "unigram_only": unigram_only}, vocab_size=vocab)
    unigram: dict[int, int] = {}
    bucket_owner: dict[int, tuple[int, int]] = {}  # bucket -> (key, first successor)
    for rows in harvests:
        for previous, token, successor in rows:
            unigram[token] = successor
            if previous >= 0 and not unigram_only:
                key = previous * vocab + token
                bucket_owner[int(bigram_bucket(np.array([key]), buckets)[0])] = (key, successor)
        if rows:
            previous, tokens, firsts = (list(column) for column in zip(*rows, strict=True))
            source.absorb(harvest_of(previous, tokens, [[first, (first + 1) % vocab] for first in firsts]))
    queries = [(previous, token) for previous in range(-1, vocab) for token in range(vocab)]
    found, _ = successors(source, [q[0] for q in queries], [q[1] for q in queries], k=1)
    for (previous, token), (answer,) in zip(queries, found, strict=True):
        expected = unigram.get(token, EMPTY)
        if previous >= 0 and not unigram_only:
            key = previous * vocab + token
            owner = bucket_owner.get(int(bigram_bucket(np.array([key]), buckets)[0]))
            if owner is not None and owner[0] == key:
                expected = owner[1]
        assert answer == expected


def test_a_fresh_source_trusts_a_long_copy_by_its_depth_prior() -> None:
    """Before any evidence, a copy's tokens are estimated by the prior of their copy-depth bin: a fresh 3-gram
    hit about 3 in 4, a copy that has held for dozens of tokens nearly always (what SmolLM2's copies did)."""
    source = ContextMatchSource(GooseConfig())
    passage = list(range(100, 160))
    draft = source.goose_propose(make_context([*passage, 7, 8, *passage[:40]]), 0.5)
    assert draft.tokens.tolist()[:20] == passage[40:60]
    assert source.last_match_depth == 40 and draft.depth_acceptance[0] == pytest.approx(0.93)
    fresh = source.goose_propose(make_context([1, 2, 3, 40, 41, 42, 9, 9, 1, 2, 3]), 0.5)
    assert fresh.depth_acceptance[0] == pytest.approx(0.7) and max(fresh.depth_acceptance) > 0.9
